package unsupported

import (
	"go/ast"
	"go/types"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/cfg"
)

// Analyzer reports capability negotiation whose answer is not looked at.
var Analyzer = &analysis.Analyzer{
	Name:     "unsupported",
	Doc:      "report Require helpers whose error, and capability accessors whose ok, is ignored or read only after the capability is used",
	URL:      "https://github.com/memgen/memgen/blob/main/docs/memvet.md#unsupported",
	Requires: vetspec.FlowRequires,
	Run:      run,
}

func run(pass *analysis.Pass) (any, error) {
	spec := vetspec.Load(pass)
	if spec.Contract == nil || vetspec.Generated(pass.Pkg.Path()) {
		return nil, nil
	}
	r := vetspec.NewReporter(pass)
	vetspec.Funcs(pass, func(_ ast.Node, g *cfg.CFG, body *ast.BlockStmt) { checkFunc(pass, spec, r, g, body) })
	return nil, nil
}

// what names the answer a negotiator gives besides the capability.
func what(fn *types.Func) string {
	if fn.Type().(*types.Signature).Recv() == nil {
		return "error"
	}
	return "ok"
}

func checkFunc(pass *analysis.Pass, spec *vetspec.Spec, r *vetspec.Reporter, g *cfg.CFG, body *ast.BlockStmt) {
	negotiation := func(x ast.Expr) (*ast.CallExpr, *types.Func, memapi.NegotiatorMeta, bool) {
		call, ok := ast.Unparen(x).(*ast.CallExpr)
		if !ok {
			return nil, nil, memapi.NegotiatorMeta{}, false
		}
		fn := vetspec.Callee(pass.TypesInfo, call)
		if fn == nil {
			return nil, nil, memapi.NegotiatorMeta{}, false
		}
		n, ok := spec.Negotiator(fn)
		return call, fn, n, ok
	}
	check := func(stmt ast.Node, lhs, rhs []ast.Expr) {
		if len(lhs) != 2 || len(rhs) != 1 {
			return
		}
		call, fn, n, ok := negotiation(rhs[0])
		if !ok {
			return
		}
		c, _ := lhs[0].(*ast.Ident)
		e, _ := lhs[1].(*ast.Ident)
		if c == nil || e == nil || c.Name == "_" {
			return // stored elsewhere, or only the answer wanted
		}
		if e.Name == "_" {
			r.Reportf(e, "the %s of %s is ignored: %s may be absent, and the code must say what it does then (errors.Is(err, errors.ErrUnsupported) holds for the Require error)", what(fn), fn.Name(), n.Capability)
			return
		}
		cv, ev := object(pass.TypesInfo, c), object(pass.TypesInfo, e)
		if cv == nil || ev == nil {
			return
		}
		if use := uncheckedUse(pass.TypesInfo, g, stmt, cv, ev); use != nil {
			r.Reportf(use, "%s is used before the %s of %s (line %d) is checked: %s may be absent", c.Name, what(fn), fn.Name(), pass.Fset.Position(call.Pos()).Line, n.Capability)
		}
	}
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.ExprStmt:
			if call, fn, n, ok := negotiation(n.X); ok {
				r.Reportf(call, "the result of %s is ignored: it answers whether %s is offered", fn.Name(), n.Capability)
			}
		case *ast.AssignStmt:
			check(n, n.Lhs, n.Rhs)
		case *ast.ValueSpec:
			lhs := make([]ast.Expr, len(n.Names))
			for i, id := range n.Names {
				lhs[i] = id
			}
			check(n, lhs, n.Values)
		}
		return true
	})
}

func object(info *types.Info, id *ast.Ident) *types.Var {
	obj := info.Defs[id]
	if obj == nil {
		obj = info.Uses[id]
	}
	v, _ := obj.(*types.Var)
	return v
}

// uncheckedUse returns the first node, on some path from stmt, that reads
// the capability c before anything reads the answer e, or nil.
func uncheckedUse(info *types.Info, g *cfg.CFG, stmt ast.Node, c, e *types.Var) ast.Node {
	def, rest := vetspec.After(g, stmt)
	if def == nil {
		return nil
	}
	seen := map[*cfg.Block]bool{}
	var walk func(b *cfg.Block, nodes []ast.Node) ast.Node
	walk = func(b *cfg.Block, nodes []ast.Node) ast.Node {
		for _, n := range nodes {
			if n == stmt {
				return nil // round a loop to the negotiation again
			}
			if reads(info, n, e) {
				return nil
			}
			if reads(info, n, c) {
				return n
			}
		}
		for _, s := range b.Succs {
			if !seen[s] {
				seen[s] = true
				if u := walk(s, s.Nodes); u != nil {
					return u
				}
			}
		}
		return nil
	}
	return walk(def, rest)
}

// reads reports whether n reads v: any use except as the target of an
// assignment. A closure that mentions v reads it.
func reads(info *types.Info, n ast.Node, v *types.Var) bool {
	found := false
	ast.PreorderStack(n, nil, func(n ast.Node, stack []ast.Node) bool {
		if found {
			return false
		}
		id, ok := n.(*ast.Ident)
		if !ok || info.Uses[id] != v {
			return true
		}
		if len(stack) > 0 {
			if a, ok := stack[len(stack)-1].(*ast.AssignStmt); ok {
				for _, l := range a.Lhs {
					if l == id {
						return true
					}
				}
			}
		}
		found = true
		return false
	})
	return found
}
