// Package vetspec is what memvet's analyzers share: the spec's data
// (memapi.Meta and memapi.Vet) resolved against the packages under analysis,
// which files are exempt, and the //memvet:allow escape.
package vetspec

import (
	"go/ast"
	"go/types"
	"slices"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
	"golang.org/x/tools/go/analysis"
)

// Spec is the spec as seen from one package under analysis.
type Spec struct {
	// Contract is the contract package as the analyzed package imports it
	// (directly or not), or nil when it does not depend on the contract.
	Contract *types.Package
}

// Load resolves the spec for pass. A package that does not depend on the
// contract has nothing memvet checks (Contract is nil).
func Load(pass *analysis.Pass) *Spec {
	return &Spec{Contract: findPackage(pass.Pkg, memapi.Vet.Contract, map[*types.Package]bool{})}
}

func findPackage(p *types.Package, path string, seen map[*types.Package]bool) *types.Package {
	if p.Path() == path {
		return p
	}
	if seen[p] {
		return nil
	}
	seen[p] = true
	for _, q := range p.Imports() {
		if r := findPackage(q, path, seen); r != nil {
			return r
		}
	}
	return nil
}

// Interface returns the contract interface named n, or nil.
func (s *Spec) Interface(n string) *types.Interface {
	if s.Contract == nil || n == "" {
		return nil
	}
	tn, ok := s.Contract.Scope().Lookup(n).(*types.TypeName)
	if !ok {
		return nil
	}
	i, _ := tn.Type().Underlying().(*types.Interface)
	return i
}

// Generated reports whether path is a package memgen writes.
func Generated(path string) bool { return slices.Contains(memapi.Vet.Generated, path) }

// Mechanism reports whether path is a hand-written mechanism package.
func Mechanism(path string) bool { return slices.Contains(memapi.Vet.Mechanisms, path) }

// Ledger reports whether path may implement the grant and account roles.
func Ledger(path string) bool { return slices.Contains(memapi.Vet.Ledgers, path) }

// Exempt reports whether f is outside what memvet checks: generated code
// (memgen's or any other generator's) and tests, which leak handles and
// call mechanisms directly on purpose to test the backstops.
func Exempt(pass *analysis.Pass, f *ast.File) bool {
	if ast.IsGenerated(f) {
		return true
	}
	return strings.HasSuffix(pass.Fset.File(f.Pos()).Name(), "_test.go")
}

// Effect returns the spec's declaration of fn when fn is a consuming or
// refunding capability method: the method of a capability interface, or a
// method with the same name and signature on a type that implements that
// interface.
func (s *Spec) Effect(fn *types.Func) (memapi.MethodMeta, bool) {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil || s.Contract == nil {
		return memapi.MethodMeta{}, false
	}
	for _, c := range memapi.Meta.Capabilities {
		for _, m := range c.Methods {
			if m.Name != fn.Name() || (m.Effect != memapi.EffectConsumes && m.Effect != memapi.EffectRefunds) {
				continue
			}
			iface := s.Interface(c.Name)
			if iface == nil {
				continue
			}
			if fn.Pkg() == s.Contract {
				if im := lookupMethod(iface, m.Name); im == fn {
					return m, true
				}
				continue
			}
			im := lookupMethod(iface, m.Name)
			if im == nil || !types.Identical(dropRecv(sig), dropRecv(im.Type().(*types.Signature))) {
				continue
			}
			recv := sig.Recv().Type()
			if types.Implements(recv, iface) || types.Implements(types.NewPointer(recv), iface) {
				return m, true
			}
		}
	}
	return memapi.MethodMeta{}, false
}

func lookupMethod(iface *types.Interface, name string) *types.Func {
	for m := range iface.Methods() {
		if m.Name() == name {
			return m
		}
	}
	return nil
}

func dropRecv(s *types.Signature) *types.Signature {
	return types.NewSignatureType(nil, nil, nil, s.Params(), s.Results(), s.Variadic())
}

// OwningHandle returns the ownership declaration of t (a named owning handle
// type or a pointer to one).
func OwningHandle(t types.Type) (memapi.OwningHandleMeta, bool) {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := types.Unalias(t).(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return memapi.OwningHandleMeta{}, false
	}
	for _, h := range memapi.Vet.OwningHandles {
		if h.Package == n.Obj().Pkg().Path() && h.Type == n.Obj().Name() {
			return h, true
		}
	}
	return memapi.OwningHandleMeta{}, false
}

// Negotiator returns the negotiation helper fn is: a Require helper of the
// contract, or an optional capability's accessor method (on any type).
func (s *Spec) Negotiator(fn *types.Func) (memapi.NegotiatorMeta, bool) {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || s.Contract == nil {
		return memapi.NegotiatorMeta{}, false
	}
	for _, n := range memapi.Vet.Negotiators {
		if sig.Recv() == nil && fn.Pkg() == s.Contract && fn.Name() == n.Require {
			return n, true
		}
		if sig.Recv() != nil && fn.Name() == n.Accessor && sig.Results().Len() == 2 {
			if basic, ok := sig.Results().At(1).Type().(*types.Basic); ok && basic.Kind() == types.Bool {
				return n, true
			}
		}
	}
	return memapi.NegotiatorMeta{}, false
}

// Callee returns the function or method a call invokes statically, or nil.
func Callee(info *types.Info, call *ast.CallExpr) *types.Func {
	fun := ast.Unparen(call.Fun)
	if ix, ok := fun.(*ast.IndexExpr); ok { // generic instantiation f[T](...)
		fun = ix.X
	}
	if ix, ok := fun.(*ast.IndexListExpr); ok {
		fun = ix.X
	}
	switch f := fun.(type) {
	case *ast.Ident:
		fn, _ := info.Uses[f].(*types.Func)
		return fn
	case *ast.SelectorExpr:
		fn, _ := info.Uses[f.Sel].(*types.Func)
		return fn
	}
	return nil
}
