package vetspec

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"sort"
	"strings"
)

// Facts records which error variables a path knows to be nil (true) or
// not (false). It is copied on change.
type Facts map[*types.Var]bool

func (f Facts) With(v *types.Var, isNil bool) Facts {
	g := make(Facts, len(f)+1)
	for k, x := range f {
		g[k] = x
	}
	g[v] = isNil
	return g
}

// Forget drops what n may change: variables assigned in n or whose address
// n takes (closures are not run here).
func (f Facts) Forget(info *types.Info, n ast.Node) Facts {
	if len(f) == 0 {
		return f
	}
	out := f
	drop := func(x ast.Expr) {
		if id, ok := ast.Unparen(x).(*ast.Ident); ok {
			if v, ok := info.Uses[id].(*types.Var); ok {
				if _, known := out[v]; known {
					g := make(Facts, len(out))
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

// Key identifies the facts at a block, for a walk's seen set.
func (f Facts) Key(block int) string {
	parts := make([]string, 0, len(f))
	for v, isNil := range f {
		parts = append(parts, fmt.Sprintf("%d=%t", v.Pos(), isNil))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d:%s", block, strings.Join(parts, ","))
}

// NilTest returns the local error variable a cond compares with nil and the
// operator (token.NEQ or token.EQL), or nil.
func NilTest(info *types.Info, cond ast.Expr) (*types.Var, token.Token) {
	b, ok := ast.Unparen(cond).(*ast.BinaryExpr)
	if !ok || (b.Op != token.NEQ && b.Op != token.EQL) {
		return nil, token.ILLEGAL
	}
	isNil := func(x ast.Expr) bool {
		id, ok := ast.Unparen(x).(*ast.Ident)
		return ok && info.Uses[id] == types.Universe.Lookup("nil")
	}
	switch {
	case isNil(b.Y) && errVar(info, b.X) != nil:
		return errVar(info, b.X), b.Op
	case isNil(b.X) && errVar(info, b.Y) != nil:
		return errVar(info, b.Y), b.Op
	}
	return nil, token.ILLEGAL
}

// Nilness is what a branch tells of an error variable.
type Nilness int8

// What a branch tells.
const (
	Unknown Nilness = iota
	Nil
	NotNil
)

// ErrBranches returns the local error variable a condition tests and what
// its true and false branches tell of it: `err != nil`, `err == nil`,
// errors.Is(err, target) and errors.As(err, &target) (true only when err is
// not nil), and their negations. It returns nil for any other condition.
func ErrBranches(info *types.Info, cond ast.Expr) (*types.Var, [2]Nilness) {
	cond = ast.Unparen(cond)
	if u, ok := cond.(*ast.UnaryExpr); ok && u.Op == token.NOT {
		v, b := ErrBranches(info, u.X)
		return v, [2]Nilness{b[1], b[0]}
	}
	if v, op := NilTest(info, cond); v != nil {
		if op == token.EQL {
			return v, [2]Nilness{Nil, NotNil}
		}
		return v, [2]Nilness{NotNil, Nil}
	}
	call, ok := cond.(*ast.CallExpr)
	if !ok || len(call.Args) != 2 {
		return nil, [2]Nilness{}
	}
	fn := Callee(info, call)
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != "errors" || (fn.Name() != "Is" && fn.Name() != "As") {
		return nil, [2]Nilness{}
	}
	if v := errVar(info, call.Args[0]); v != nil {
		return v, [2]Nilness{NotNil, Unknown}
	}
	return nil, [2]Nilness{}
}

func errVar(info *types.Info, x ast.Expr) *types.Var {
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
