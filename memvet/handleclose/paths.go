package handleclose

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"sort"
	"strings"

	"golang.org/x/tools/go/cfg"
)

// leakPath finds a path through g from the statement that gave hv its handle
// to a return on which the handle is neither closed nor let go of (returned,
// stored, passed to a call, captured by a closure, sent). It returns the
// return statement ending the path (possibly synthetic), or nil.
//
// The walk knows which error variables are nil along the path: a branch on
// `x != nil` or `x == nil` that contradicts what the path already knows is
// not taken. The error returned with the handle starts out nil, since on the
// paths where it is not the handle is nil and there is nothing to leak; an
// assignment to a variable (or taking its address) forgets what was known.
func leakPath(info *types.Info, g *cfg.CFG, hv handleVar, sig *types.Signature) *ast.ReturnStmt {
	named := false
	for v := range sig.Results().Variables() {
		if v == hv.v {
			named = true
		}
	}
	var def *cfg.Block
	var rest []ast.Node
	for _, b := range g.Blocks {
		for i, n := range b.Nodes {
			if n == hv.stmt {
				def, rest = b, b.Nodes[i+1:]
			}
		}
	}
	if def == nil {
		return nil // not in the graph (unreachable code)
	}
	start := facts{}
	if hv.err != nil {
		start = start.with(hv.err, true)
	}
	seen := map[string]bool{}
	budget := 20000 // states; past it the function is too tangled to judge, and nothing is reported
	var walk func(b *cfg.Block, nodes []ast.Node, known facts) *ast.ReturnStmt
	walk = func(b *cfg.Block, nodes []ast.Node, known facts) *ast.ReturnStmt {
		for _, n := range nodes {
			if letsGo(info, n, hv, named) {
				return nil
			}
			known = known.forget(info, n)
		}
		if ret := b.Return(); ret != nil {
			return ret
		}
		type edge struct {
			b     *cfg.Block
			known facts
		}
		var next []edge
		for _, s := range b.Succs {
			next = append(next, edge{s, known})
		}
		if len(b.Succs) == 2 && len(b.Nodes) > 0 {
			if cond, ok := b.Nodes[len(b.Nodes)-1].(ast.Expr); ok {
				if v, op := nilTest(info, cond); v != nil {
					isNil := op == token.EQL // on the true branch
					next = next[:0]
					for i, s := range b.Succs {
						branchNil := isNil == (i == 0)
						if was, ok := known[v]; ok && was != branchNil {
							continue // contradicts the path
						}
						next = append(next, edge{s, known.with(v, branchNil)})
					}
				}
			}
		}
		for _, e := range next {
			key := e.known.key(e.b)
			if seen[key] {
				continue
			}
			seen[key] = true
			if budget--; budget < 0 {
				return nil
			}
			if ret := walk(e.b, e.b.Nodes, e.known); ret != nil {
				return ret
			}
		}
		return nil
	}
	return walk(def, rest, start)
}

// facts records which error variables a path knows to be nil (true) or
// not (false). It is copied on change.
type facts map[*types.Var]bool

func (f facts) with(v *types.Var, isNil bool) facts {
	g := make(facts, len(f)+1)
	for k, x := range f {
		g[k] = x
	}
	g[v] = isNil
	return g
}

// forget drops what n may change: variables assigned in n or whose address
// n takes (closures are not run here).
func (f facts) forget(info *types.Info, n ast.Node) facts {
	if len(f) == 0 {
		return f
	}
	out := f
	drop := func(x ast.Expr) {
		if id, ok := ast.Unparen(x).(*ast.Ident); ok {
			if v, ok := info.Uses[id].(*types.Var); ok {
				if _, known := out[v]; known {
					g := make(facts, len(out))
					for k, x := range out {
						if k != v {
							g[k] = x
						}
					}
					out = g
				}
			}
		}
	}
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.AssignStmt:
			for _, l := range n.Lhs {
				drop(l)
			}
		case *ast.UnaryExpr:
			if n.Op == token.AND {
				drop(n.X)
			}
		}
		return true
	})
	return out
}

func (f facts) key(b *cfg.Block) string {
	parts := make([]string, 0, len(f))
	for v, isNil := range f {
		parts = append(parts, fmt.Sprintf("%d=%t", v.Pos(), isNil))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d:%s", b.Index, strings.Join(parts, ","))
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

// nilTest returns the local error variable a cond compares with nil and the
// operator (token.NEQ or token.EQL), or nil.
func nilTest(info *types.Info, cond ast.Expr) (*types.Var, token.Token) {
	b, ok := ast.Unparen(cond).(*ast.BinaryExpr)
	if !ok || (b.Op != token.NEQ && b.Op != token.EQL) {
		return nil, token.ILLEGAL
	}
	isNil := func(x ast.Expr) bool {
		id, ok := ast.Unparen(x).(*ast.Ident)
		return ok && info.Uses[id] == types.Universe.Lookup("nil")
	}
	errVar := func(x ast.Expr) *types.Var {
		id, ok := ast.Unparen(x).(*ast.Ident)
		if !ok {
			return nil
		}
		v, ok := info.Uses[id].(*types.Var)
		if !ok || !types.Identical(v.Type(), types.Universe.Lookup("error").Type()) {
			return nil
		}
		return v
	}
	switch {
	case isNil(b.Y) && errVar(b.X) != nil:
		return errVar(b.X), b.Op
	case isNil(b.X) && errVar(b.Y) != nil:
		return errVar(b.Y), b.Op
	}
	return nil, token.ILLEGAL
}
