package recorduse

import (
	"go/ast"
	"go/types"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/cfg"
)

// Analyzer reports device work on an owning handle's memory that no fence
// recorded on the handle covers.
var Analyzer = &analysis.Analyzer{
	Name:     "recorduse",
	Doc:      "report stream work on an owning handle's address after which some path returns without RecordUse on the handle or a Synchronize of the stream",
	URL:      "https://github.com/memgen/memgen/blob/main/docs/memvet.md#recorduse",
	Requires: vetspec.FlowRequires,
	Run:      run,
}

func run(pass *analysis.Pass) (any, error) {
	spec := vetspec.Load(pass)
	if spec.Contract == nil || vetspec.Generated(pass.Pkg.Path()) || len(memapi.Vet.OwningHandles) == 0 {
		return nil, nil
	}
	stream := spec.Interface(memapi.Vet.Stream)
	addrName, _ := spec.Contract.Scope().Lookup("DeviceAddr").(*types.TypeName)
	if stream == nil || addrName == nil {
		return nil, nil
	}
	w := &work{pass: pass, r: vetspec.NewReporter(pass), stream: stream, addr: addrName.Type()}
	vetspec.Funcs(pass, func(_ ast.Node, g *cfg.CFG, body *ast.BlockStmt) { w.fn(g, body) })
	return nil, nil
}

type work struct {
	pass   *analysis.Pass
	r      *vetspec.Reporter
	stream *types.Interface
	addr   types.Type
}

// submits reports whether fn is a stream method that takes a device
// address: device work, on the contract's Stream or an implementation.
func (w *work) submits(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil {
		return false
	}
	var im *types.Func
	for m := range w.stream.Methods() {
		if m.Name() == fn.Name() {
			im = m
		}
	}
	if im == nil {
		return false
	}
	takesAddr := false
	for p := range im.Type().(*types.Signature).Params().Variables() {
		if types.Identical(p.Type(), w.addr) {
			takesAddr = true
		}
	}
	if !takesAddr {
		return false
	}
	if im == fn {
		return true
	}
	recv := sig.Recv().Type()
	return types.Identical(sig.Params(), im.Type().(*types.Signature).Params()) &&
		(types.Implements(recv, w.stream) || types.Implements(types.NewPointer(recv), w.stream))
}

func (w *work) fn(g *cfg.CFG, body *ast.BlockStmt) {
	if g == nil {
		return
	}
	info := w.pass.TypesInfo
	for _, b := range g.Blocks {
		for _, node := range b.Nodes {
			ast.Inspect(node, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok {
					return false
				}
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				fn := vetspec.Callee(info, call)
				sel, isSel := ast.Unparen(call.Fun).(*ast.SelectorExpr)
				if fn == nil || !isSel || !w.submits(fn) {
					return true
				}
				for _, a := range call.Args {
					if !types.Identical(info.TypeOf(a), w.addr) {
						continue
					}
					for _, h := range handlesIn(info, a) {
						w.check(g, node, call, sel.X, h)
					}
				}
				return true
			})
		}
	}
}

// handlesIn returns the owning handles X whose X.Addr() the address
// expression a is computed from.
func handlesIn(info *types.Info, a ast.Expr) []ast.Expr {
	var hs []ast.Expr
	ast.Inspect(a, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 0 {
			return true
		}
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Addr" {
			return true
		}
		if _, ok := vetspec.OwningHandle(info.TypeOf(sel.X)); ok {
			hs = append(hs, sel.X)
		}
		return true
	})
	return hs
}

// check walks from the node holding the submission: every path to a
// return must record a use on the handle, synchronize the stream, or hand
// the handle on. A submission whose error is tested is followed only where
// it succeeded (a failed one submitted nothing).
func (w *work) check(g *cfg.CFG, node ast.Node, call *ast.CallExpr, stream, handle ast.Expr) {
	info := w.pass.TypesInfo
	start := vetspec.Facts{}
	if as, ok := node.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 && ast.Unparen(as.Rhs[0]) == call {
		if id, ok := as.Lhs[0].(*ast.Ident); ok {
			if v, ok := objectOf(info, id).(*types.Var); ok {
				start = start.With(v, true)
			}
		}
	}
	hs, ss := types.ExprString(handle), types.ExprString(stream)
	var hv *types.Var
	if id, ok := ast.Unparen(handle).(*ast.Ident); ok {
		hv, _ = info.Uses[id].(*types.Var)
	}
	done := func(n ast.Node) bool {
		found := false
		ast.PreorderStack(n, nil, func(n ast.Node, stack []ast.Node) bool {
			if found {
				return false
			}
			switch n := n.(type) {
			case *ast.CallExpr:
				if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok {
					x := types.ExprString(sel.X)
					if sel.Sel.Name == "RecordUse" && x == hs || sel.Sel.Name == "Synchronize" && x == ss {
						found = true
					}
				}
			case *ast.Ident:
				// The handle itself handed on (returned, passed, stored):
				// whoever receives it records.
				if hv != nil && info.Uses[n] == hv && len(stack) > 0 {
					switch p := stack[len(stack)-1].(type) {
					case *ast.SelectorExpr:
						if p.X == n {
							return true
						}
					case *ast.BinaryExpr:
						return true
					}
					found = true
				}
			}
			return true
		})
		return found
	}
	if ret := vetspec.PathToReturn(info, g, node, start, done); ret != nil {
		w.r.Reportf(call, "device work on the memory of %s is submitted here, and the return at line %d is reached without %s.RecordUse of a fence recorded after it (or %s.Synchronize): closing %s could free the memory under the work",
			hs, w.pass.Fset.Position(ret.Pos()).Line, hs, ss, hs)
	}
}

func objectOf(info *types.Info, id *ast.Ident) types.Object {
	if o := info.Defs[id]; o != nil {
		return o
	}
	return info.Uses[id]
}
