package nobypass

import (
	"go/ast"
	"go/token"
	"go/types"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memvet/internal/vetspec"
)

// source is one value that flows into a variable, field or result: the
// expression and, when the expression is a call with several results, which
// one (-1 otherwise). A nil expression stands for a value memvet cannot see
// (a range variable, an exported function's parameter, a callback's).
type source struct {
	x   ast.Expr
	idx int
}

// provenance answers "is this value the checked wrapper?" for one package,
// flow-insensitively: a variable, struct field or function result is checked
// when every value the package ever stores into it is checked. A call of the
// checked package is checked; a Require helper or accessor of a checked
// mechanism is checked; a conversion, type assertion or parenthesis of a
// checked value is checked. A parameter is checked only when its function is
// unexported, never used as a value, and every call passes a checked value:
// an exported function's parameters come from callers memvet does not see.
type provenance struct {
	info    *types.Info
	spec    *vetspec.Spec
	pkg     *types.Package
	sources map[types.Object][]source
	results map[*types.Func][][]source // per result index
	memo    map[types.Object]bool
	busy    map[types.Object]bool
}

func newProvenance(info *types.Info, spec *vetspec.Spec, pkg *types.Package, files []*ast.File) *provenance {
	p := &provenance{info: info, spec: spec, pkg: pkg,
		sources: map[types.Object][]source{}, results: map[*types.Func][][]source{},
		memo: map[types.Object]bool{}, busy: map[types.Object]bool{}}
	escaped := map[*types.Func]bool{}
	calls := map[*types.Func][]*ast.CallExpr{}
	for _, f := range files {
		p.index(f, escaped, calls)
	}
	for fn, cs := range calls {
		sig := fn.Type().(*types.Signature)
		if fn.Exported() || escaped[fn] || sig.Variadic() {
			continue
		}
		for _, c := range cs {
			if len(c.Args) != sig.Params().Len() {
				continue // f(g()) with a tuple: left unknown
			}
			for i, a := range c.Args {
				v := sig.Params().At(i)
				p.sources[v] = append(p.sources[v], source{a, -1})
			}
		}
	}
	// Parameters without callers, or of exported or escaping functions,
	// stay without sources: unknown.
	return p
}

func (p *provenance) index(f *ast.File, escaped map[*types.Func]bool, calls map[*types.Func][]*ast.CallExpr) {
	var fns []*types.Func // enclosing declared functions, for returns
	var lits []bool       // whether the innermost function is a literal
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			fn, _ := p.info.Defs[n.Name].(*types.Func)
			fns = append(fns, fn)
			lits = append(lits, false)
			if n.Body != nil {
				ast.Inspect(n.Body, visit)
			}
			fns, lits = fns[:len(fns)-1], lits[:len(lits)-1]
			return false
		case *ast.FuncLit:
			lits = append(lits, true)
			ast.Inspect(n.Body, visit)
			lits = lits[:len(lits)-1]
			return false
		case *ast.ReturnStmt:
			if len(lits) > 0 && !lits[len(lits)-1] && len(fns) > 0 && fns[len(fns)-1] != nil {
				fn := fns[len(fns)-1]
				rs := p.results[fn]
				nres := fn.Type().(*types.Signature).Results().Len()
				if rs == nil {
					rs = make([][]source, nres)
					p.results[fn] = rs
				}
				switch {
				case len(n.Results) == nres:
					for i, r := range n.Results {
						rs[i] = append(rs[i], source{r, -1})
					}
				case len(n.Results) == 1 && nres > 1:
					for i := range rs {
						rs[i] = append(rs[i], source{n.Results[0], i})
					}
				default: // naked return: the named results' own sources
					for i := range rs {
						rs[i] = append(rs[i], source{nil, -1})
					}
				}
			}
		case *ast.AssignStmt:
			p.assign(n.Lhs, n.Rhs)
		case *ast.ValueSpec:
			lhs := make([]ast.Expr, len(n.Names))
			for i, id := range n.Names {
				lhs[i] = id
			}
			p.assign(lhs, n.Values)
		case *ast.RangeStmt:
			for _, x := range []ast.Expr{n.Key, n.Value} {
				if obj := p.target(x); obj != nil {
					p.sources[obj] = append(p.sources[obj], source{nil, -1})
				}
			}
		case *ast.CompositeLit:
			p.composite(n)
		case *ast.CallExpr:
			if fn := vetspec.Callee(p.info, n); fn != nil && fn.Pkg() == p.pkg {
				calls[fn] = append(calls[fn], n)
			}
		case *ast.Ident:
			// A function used other than as a callee escapes: its
			// parameters may come from anywhere.
			if fn, ok := p.info.Uses[n].(*types.Func); ok && fn.Pkg() == p.pkg {
				escaped[fn] = true
			}
		case *ast.SelectorExpr:
			ast.Inspect(n.X, visit)
			if fn, ok := p.info.Uses[n.Sel].(*types.Func); ok && fn.Pkg() == p.pkg {
				escaped[fn] = true
			}
			return false
		}
		if call, ok := n.(*ast.CallExpr); ok {
			// The callee itself is not an escape; visit only its parts.
			switch fun := ast.Unparen(call.Fun).(type) {
			case *ast.Ident:
			case *ast.SelectorExpr:
				ast.Inspect(fun.X, visit)
			default:
				ast.Inspect(call.Fun, visit)
			}
			for _, a := range call.Args {
				ast.Inspect(a, visit)
			}
			return false
		}
		return true
	}
	ast.Inspect(f, visit)
}

// target returns the variable or field an assignment's left side names, or
// nil for blanks, map and slice elements and dereferences.
func (p *provenance) target(x ast.Expr) types.Object {
	switch x := ast.Unparen(x).(type) {
	case *ast.Ident:
		if x.Name == "_" {
			return nil
		}
		if obj := p.info.Defs[x]; obj != nil {
			return obj
		}
		return p.info.Uses[x]
	case *ast.SelectorExpr:
		if sel := p.info.Selections[x]; sel != nil && sel.Kind() == types.FieldVal {
			return sel.Obj()
		}
		return p.info.Uses[x.Sel] // package-qualified variable
	}
	return nil
}

func (p *provenance) assign(lhs, rhs []ast.Expr) {
	switch {
	case len(lhs) == len(rhs):
		for i := range lhs {
			if obj := p.target(lhs[i]); obj != nil {
				p.sources[obj] = append(p.sources[obj], source{rhs[i], -1})
			}
		}
	case len(rhs) == 1:
		for i := range lhs {
			if obj := p.target(lhs[i]); obj != nil {
				p.sources[obj] = append(p.sources[obj], source{rhs[0], i})
			}
		}
	}
	// var x T stores the zero value: calling a nil interface panics and
	// bypasses nothing, so it adds no source.
}

func (p *provenance) composite(lit *ast.CompositeLit) {
	tv, ok := p.info.Types[lit]
	if !ok {
		return
	}
	t := tv.Type
	if ptr, ok := t.Underlying().(*types.Pointer); ok {
		t = ptr.Elem()
	}
	st, ok := t.Underlying().(*types.Struct)
	if !ok {
		return
	}
	for i, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok {
				if obj := p.info.Uses[id]; obj != nil {
					p.sources[obj] = append(p.sources[obj], source{kv.Value, -1})
				}
			}
			continue
		}
		if i < st.NumFields() {
			p.sources[st.Field(i)] = append(p.sources[st.Field(i)], source{e, -1})
		}
	}
}

// checked reports whether x (result idx of a call, or -1) is the checked
// wrapper or a capability reached through it.
func (p *provenance) checked(x ast.Expr, idx int) bool {
	switch x := ast.Unparen(x).(type) {
	case *ast.Ident:
		if x.Name == "nil" {
			return true // calling a nil value panics; it bypasses nothing
		}
		return p.object(p.info.Uses[x])
	case *ast.SelectorExpr:
		if sel := p.info.Selections[x]; sel != nil {
			if sel.Kind() == types.FieldVal {
				return p.object(sel.Obj())
			}
			return false
		}
		return p.object(p.info.Uses[x.Sel])
	case *ast.TypeAssertExpr:
		return idx <= 0 && p.checked(x.X, -1)
	case *ast.UnaryExpr:
		return x.Op == token.AND && p.checked(x.X, -1)
	case *ast.StarExpr:
		return p.checked(x.X, -1)
	case *ast.CallExpr:
		if tv, ok := p.info.Types[x.Fun]; ok && tv.IsType() && len(x.Args) == 1 {
			return p.checked(x.Args[0], -1) // a conversion
		}
		fn := vetspec.Callee(p.info, x)
		if fn == nil {
			return false
		}
		if fn.Pkg() != nil && fn.Pkg().Path() == memapi.Vet.Checked {
			return true
		}
		if _, ok := p.spec.Negotiator(fn); ok && idx <= 0 {
			if fn.Type().(*types.Signature).Recv() == nil {
				return len(x.Args) == 1 && p.checked(x.Args[0], -1)
			}
			if sel, ok := ast.Unparen(x.Fun).(*ast.SelectorExpr); ok {
				return p.checked(sel.X, -1)
			}
			return false
		}
		if fn.Pkg() == p.pkg {
			return p.result(fn, max(idx, 0))
		}
	}
	return false
}

func (p *provenance) object(obj types.Object) bool {
	if obj == nil || obj.Pkg() != p.pkg {
		return false
	}
	if v, ok := p.memo[obj]; ok {
		return v
	}
	if p.busy[obj] {
		return true // a cycle adds no new kind of value
	}
	p.busy[obj] = true
	srcs := p.sources[obj]
	ok := len(srcs) > 0
	for _, s := range srcs {
		if s.x == nil || !p.checked(s.x, s.idx) {
			ok = false
			break
		}
	}
	delete(p.busy, obj)
	p.memo[obj] = ok
	return ok
}

func (p *provenance) result(fn *types.Func, i int) bool {
	rs := p.results[fn]
	if i >= len(rs) || len(rs[i]) == 0 {
		return false
	}
	key := fn.Type().(*types.Signature).Results().At(i)
	if v, ok := p.memo[key]; ok {
		return v
	}
	if p.busy[key] {
		return true
	}
	p.busy[key] = true
	ok := true
	for _, s := range rs[i] {
		if s.x == nil || !p.checked(s.x, s.idx) {
			ok = false
			break
		}
	}
	delete(p.busy, key)
	p.memo[key] = ok
	return ok
}
