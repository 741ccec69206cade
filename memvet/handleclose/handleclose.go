package handleclose

import (
	"fmt"
	"go/ast"
	"go/types"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/cfg"
)

// Analyzer reports owning handles that some path neither closes, returns,
// stores nor passes on.
var Analyzer = &analysis.Analyzer{
	Name:     "handleclose",
	Doc:      "report owning handles (spec ownership.handles) that are not closed, returned, stored or passed on along every path",
	URL:      "https://github.com/memgen/memgen/blob/main/docs/memvet.md#handleclose",
	Requires: vetspec.FlowRequires,
	Run:      run,
}

func run(pass *analysis.Pass) (any, error) {
	if len(memapi.Vet.OwningHandles) == 0 || vetspec.Generated(pass.Pkg.Path()) {
		return nil, nil
	}
	r := vetspec.NewReporter(pass)
	vetspec.Funcs(pass, func(fn ast.Node, g *cfg.CFG, body *ast.BlockStmt) {
		var sig *types.Signature
		switch fn := fn.(type) {
		case *ast.FuncDecl:
			if f, ok := pass.TypesInfo.Defs[fn.Name].(*types.Func); ok {
				sig = f.Type().(*types.Signature)
			}
		case *ast.FuncLit:
			sig, _ = pass.TypesInfo.TypeOf(fn).(*types.Signature)
		}
		if sig != nil {
			checkFunc(pass, r, g, body, sig)
		}
	})
	return nil, nil
}

// handleVar is a local variable that receives an owning handle from a call,
// with the error that came with it (nil when the call returns none).
type handleVar struct {
	v    *types.Var
	err  *types.Var
	h    memapi.OwningHandleMeta
	stmt ast.Node // the AssignStmt or ValueSpec, as the CFG holds it
	call *ast.CallExpr
}

func checkFunc(pass *analysis.Pass, r *vetspec.Reporter, g *cfg.CFG, body *ast.BlockStmt, sig *types.Signature) {
	var vars []handleVar
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false // its own function
		case *ast.ExprStmt:
			if call, ok := ast.Unparen(n.X).(*ast.CallExpr); ok {
				for _, h := range handleResults(pass.TypesInfo, call) {
					r.Reportf(call, "the %s returned here is discarded: %s it (or defer it) so its memory is released", handleName(h.h), h.h.Close)
					break
				}
			}
		case *ast.AssignStmt:
			vars = append(vars, assigned(pass, r, n, n.Lhs, n.Rhs)...)
		case *ast.ValueSpec:
			lhs := make([]ast.Expr, len(n.Names))
			for i, id := range n.Names {
				lhs[i] = id
			}
			vars = append(vars, assigned(pass, r, n, lhs, n.Values)...)
		}
		return true
	})
	for _, hv := range vars {
		if ret := leakPath(pass.TypesInfo, g, hv, sig); ret != nil {
			d := analysis.Diagnostic{Pos: hv.call.Pos(), End: hv.call.End(),
				Message: fmt.Sprintf("the %s %s is not closed, returned, stored or passed on along every path: the return at line %d is reached with it open",
					handleName(hv.h), hv.v.Name(), pass.Fset.Position(ret.Pos()).Line)}
			if fix, ok := deferFix(pass, body, hv); ok {
				d.SuggestedFixes = []analysis.SuggestedFix{fix}
			}
			r.Report(d)
		}
	}
}

type result struct {
	i int
	h memapi.OwningHandleMeta
}

// handleResults returns the owning handles among a call's results.
func handleResults(info *types.Info, call *ast.CallExpr) []result {
	t := info.TypeOf(call)
	if t == nil {
		return nil
	}
	var out []result
	if tup, ok := t.(*types.Tuple); ok {
		for i := range tup.Len() {
			if h, ok := vetspec.OwningHandle(tup.At(i).Type()); ok {
				out = append(out, result{i, h})
			}
		}
		return out
	}
	if tv := info.Types[call.Fun]; tv.IsType() {
		return nil // a conversion makes no handle
	}
	if h, ok := vetspec.OwningHandle(t); ok {
		out = append(out, result{0, h})
	}
	return out
}

// assigned looks at lhs = call(...): a handle assigned to the blank is
// reported, one assigned to a local variable is returned for the path
// check, one stored elsewhere is the store's owner's business.
func assigned(pass *analysis.Pass, r *vetspec.Reporter, stmt ast.Node, lhs, rhs []ast.Expr) []handleVar {
	if len(rhs) != 1 {
		return nil
	}
	call, ok := ast.Unparen(rhs[0]).(*ast.CallExpr)
	if !ok {
		return nil
	}
	res := handleResults(pass.TypesInfo, call)
	if len(res) == 0 || (len(lhs) != 1 && len(lhs) != resultCount(pass.TypesInfo, call)) {
		return nil
	}
	var errVar *types.Var
	if len(lhs) > 1 {
		if id, ok := lhs[len(lhs)-1].(*ast.Ident); ok && id.Name != "_" && types.Identical(pass.TypesInfo.TypeOf(id), types.Universe.Lookup("error").Type()) {
			errVar = localVar(pass.TypesInfo, id)
		}
	}
	var out []handleVar
	for _, h := range res {
		id, ok := lhs[h.i].(*ast.Ident)
		if !ok {
			continue // stored in a field, map or slice
		}
		if id.Name == "_" {
			r.Reportf(id, "the %s returned by this call is discarded: %s it (or defer it) so its memory is released", handleName(h.h), h.h.Close)
			continue
		}
		if v := localVar(pass.TypesInfo, id); v != nil {
			out = append(out, handleVar{v: v, err: errVar, h: h.h, stmt: stmt, call: call})
		}
	}
	return out
}

func resultCount(info *types.Info, call *ast.CallExpr) int {
	if tup, ok := info.TypeOf(call).(*types.Tuple); ok {
		return tup.Len()
	}
	return 1
}

// localVar returns the variable id defines or assigns when it is local to a
// function (a package variable is stored, not leaked).
func localVar(info *types.Info, id *ast.Ident) *types.Var {
	obj := info.Defs[id]
	if obj == nil {
		obj = info.Uses[id]
	}
	v, ok := obj.(*types.Var)
	if !ok || v.Parent() == nil || v.Parent() == v.Pkg().Scope() {
		return nil
	}
	return v
}

func handleName(h memapi.OwningHandleMeta) string {
	return h.Package[strings.LastIndex(h.Package, "/")+1:] + "." + h.Type
}
