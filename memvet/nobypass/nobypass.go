package nobypass

import (
	"go/ast"
	"go/types"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memvet/internal/vetspec"
	"golang.org/x/tools/go/analysis"
)

// Analyzer reports consuming and refunding calls that bypass the checked
// wrapper, and grant or account implementations outside the ledgers.
var Analyzer = &analysis.Analyzer{
	Name: "nobypass",
	Doc:  "report calls of consuming or refunding capability methods that bypass the checked wrapper, and ledger roles implemented outside the ledger packages",
	URL:  "https://github.com/memgen/memgen/blob/main/docs/memvet.md#nobypass",
	Run:  run,
}

func run(pass *analysis.Pass) (any, error) {
	spec := vetspec.Load(pass)
	path := pass.Pkg.Path()
	if spec.Contract == nil || vetspec.Generated(path) {
		return nil, nil
	}
	r := vetspec.NewReporter(pass)
	var files []*ast.File
	for _, f := range pass.Files {
		if !vetspec.Exempt(pass, f) {
			files = append(files, f)
		}
	}
	if !vetspec.Mechanism(path) {
		checkCalls(pass, spec, r, files)
	}
	if !vetspec.Ledger(path) {
		checkRoles(pass, spec, r, files)
	}
	return nil, nil
}

// checkCalls reports each consuming or refunding method selected on a value
// that is not provably the checked wrapper.
func checkCalls(pass *analysis.Pass, spec *vetspec.Spec, r *vetspec.Reporter, files []*ast.File) {
	var prov *provenance // built on the first capability call: most packages have none
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			fn, ok := pass.TypesInfo.Uses[sel.Sel].(*types.Func)
			if !ok {
				return true
			}
			m, ok := spec.Effect(fn)
			if !ok {
				return true
			}
			s := pass.TypesInfo.Selections[sel]
			if s != nil && s.Kind() == types.MethodVal {
				if prov == nil {
					prov = newProvenance(pass.TypesInfo, spec, pass.Pkg, files)
				}
				if prov.checked(sel.X, -1) {
					return true
				}
			}
			what := "consumes from a grant"
			if m.Effect == memapi.EffectRefunds {
				what = "refunds to an account"
			}
			r.Reportf(sel.Sel, "%s.%s %s and is called on a value that is not the checked wrapper: call it through checked.Wrap (or a pmm.Binding), which moves the ledger around it", m.Capability, m.Name, what)
			return true
		})
	}
}

// checkRoles reports named types that implement the grant or account role
// with a method of their own: only the ledger packages issue those.
// Embedding a ledger's grant without overriding its methods is not an
// implementation.
func checkRoles(pass *analysis.Pass, spec *vetspec.Spec, r *vetspec.Reporter, files []*ast.File) {
	roles := []struct {
		name  string
		iface *types.Interface
	}{{memapi.Vet.Grant, spec.Interface(memapi.Vet.Grant)}, {memapi.Vet.Account, spec.Interface(memapi.Vet.Account)}}
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, s := range gd.Specs {
				ts, ok := s.(*ast.TypeSpec)
				if !ok {
					continue
				}
				tn, ok := pass.TypesInfo.Defs[ts.Name].(*types.TypeName)
				if !ok || types.IsInterface(tn.Type()) {
					continue
				}
				for _, role := range roles {
					if role.iface == nil || !ownImplementation(tn.Type(), role.iface) {
						continue
					}
					r.Reportf(ts.Name, "%s implements memapi.%s outside the ledger packages (%s): grants and accounts are issued by the ledger, not implemented beside it", ts.Name.Name, role.name, ledgerList())
					break
				}
			}
		}
	}
}

// ownImplementation reports whether t or *t implements iface with at least
// one method declared on t itself rather than promoted from an embedded
// field.
func ownImplementation(t types.Type, iface *types.Interface) bool {
	var impl types.Type
	switch {
	case types.Implements(t, iface):
		impl = t
	case types.Implements(types.NewPointer(t), iface):
		impl = types.NewPointer(t)
	default:
		return false
	}
	for m := range iface.Methods() {
		_, index, _ := types.LookupFieldOrMethod(impl, false, m.Pkg(), m.Name())
		if len(index) == 1 {
			return true
		}
	}
	return false
}

func ledgerList() string {
	var short []string
	for _, l := range memapi.Vet.Ledgers {
		short = append(short, strings.TrimPrefix(l, memapi.Vet.Module+"/"))
	}
	return strings.Join(short, ", ")
}
