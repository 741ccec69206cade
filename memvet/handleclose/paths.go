package handleclose

import (
	"go/ast"
	"go/token"
	"go/types"

	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/cfg"
)

// leakPath finds a path through g from the statement that gave hv its handle
// to a return on which the handle is neither closed nor let go of (returned,
// stored, passed to a call, captured by a closure, sent). The error returned
// with the handle starts out nil: on the paths where it is not, the handle
// is nil and there is nothing to leak. It returns the return statement
// ending the path (possibly synthetic), or nil.
func leakPath(info *types.Info, g *cfg.CFG, hv handleVar, sig *types.Signature) *ast.ReturnStmt {
	named := false
	for v := range sig.Results().Variables() {
		if v == hv.v {
			named = true
		}
	}
	start := vetspec.Facts{}
	if hv.err != nil {
		start = start.With(hv.err, true)
	}
	return vetspec.PathToReturn(info, g, hv.stmt, start, func(n ast.Node) bool { return letsGo(info, n, hv, named) })
}

// letsGo reports whether n closes hv's handle or hands it on: any use of the
// variable as a value (returned, stored, passed, sent, converted), a call of
// its Close method, a closure that refers to it, or a naked return of it as
// a named result. Selecting a field or another method of it, or comparing it
// with nil, does not.
func letsGo(info *types.Info, n ast.Node, hv handleVar, named bool) bool {
	found := false
	ast.PreorderStack(n, nil, func(n ast.Node, stack []ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.FuncLit:
			if refers(info, n, hv.v) {
				found = true
			}
			return false
		case *ast.ReturnStmt:
			if n.Results == nil && named {
				found = true
			}
		case *ast.CallExpr:
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok && sel.Sel.Name == hv.h.Close && isVar(info, sel.X, hv.v) {
				found = true
			}
		case *ast.Ident:
			if info.Uses[n] != hv.v || len(stack) == 0 {
				return true
			}
			switch p := stack[len(stack)-1].(type) {
			case *ast.SelectorExpr:
				if p.X == n {
					return true
				}
			case *ast.BinaryExpr:
				if p.Op == token.EQL || p.Op == token.NEQ {
					return true
				}
			case *ast.AssignStmt:
				for _, l := range p.Lhs {
					if l == n {
						found = true // reassigned: from here on it is another handle
						return false
					}
				}
			}
			found = true
		}
		return true
	})
	return found
}

func refers(info *types.Info, n ast.Node, v *types.Var) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && info.Uses[id] == v {
			found = true
		}
		return !found
	})
	return found
}

func isVar(info *types.Info, x ast.Expr, v *types.Var) bool {
	id, ok := ast.Unparen(x).(*ast.Ident)
	return ok && info.Uses[id] == v
}
