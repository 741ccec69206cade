package main

import (
	"fmt"
	"go/types"
	"io"
	"sort"
	"strings"

	"github.com/memgen/memgen/gen"
	"golang.org/x/tools/go/packages"
)

// checkMechanisms loads every mechanism package the spec names and compares
// the capabilities its type implements with those the spec says it offers.
// A declared mechanism whose package does not exist yet is a warning.
func checkMechanisms(p *project, stdout, stderr io.Writer) bool {
	contract := p.module + "/" + p.spec.Packages.Contract
	patterns := []string{contract}
	byPath := map[string]*gen.Mechanism{}
	for _, m := range p.spec.Mechanisms {
		if !m.PackageWritten(p.root) {
			fmt.Fprintf(stderr, "warning: mechanism %s: package %s does not exist yet\n", m.Name, m.Package)
			continue
		}
		path := p.module + "/" + m.Package
		byPath[path] = m
		patterns = append(patterns, path)
	}
	if len(byPath) == 0 {
		return true
	}
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: p.root}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		fmt.Fprintln(stderr, "memgen check: load packages:", err)
		return false
	}
	// A package that does not compile is a failure, but its types are still
	// compared with the spec: the glue's compile-time assertion that fails on
	// a missing capability then comes with a message naming the capability.
	ok := true
	var contractPkg *types.Package
	for _, pkg := range pkgs {
		errs := packageErrors(pkg, p.root)
		for _, e := range errs {
			fmt.Fprintln(stderr, e)
			ok = false
		}
		if m := byPath[pkg.PkgPath]; m != nil && len(errs) > 0 {
			noun := "errors"
			if len(errs) == 1 {
				noun = "error"
			}
			fmt.Fprintf(stderr, "%s: mechanism %s does not build (%d %s above)\n", m.Package, m.Name, len(errs), noun)
		}
		if pkg.PkgPath == contract {
			contractPkg = pkg.Types
		}
	}
	if contractPkg == nil || contractPkg.Scope().Lookup("Mechanism") == nil {
		fmt.Fprintf(stderr, "memgen check: cannot load the contract package %s\n", contract)
		return false
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].PkgPath < pkgs[j].PkgPath })
	for _, pkg := range pkgs {
		m := byPath[pkg.PkgPath]
		if m == nil || pkg.Types == nil {
			continue
		}
		obj := pkg.Types.Scope().Lookup(m.Type)
		if obj == nil {
			fmt.Fprintf(stderr, "%s: mechanism %s: type %s not found\n", m.Package, m.Name, m.Type)
			ok = false
			continue
		}
		ptr := types.NewPointer(obj.Type())
		offered := map[string]bool{}
		for _, o := range m.Offers {
			offered[o] = true
		}
		for _, c := range p.spec.Capabilities {
			cobj := contractPkg.Scope().Lookup(c.Name)
			if cobj == nil {
				fmt.Fprintf(stderr, "memgen check: the contract package lacks capability %s: run go generate ./...\n", c.Name)
				ok = false
				continue
			}
			iface, _ := cobj.Type().Underlying().(*types.Interface)
			if iface == nil {
				continue
			}
			implements := types.Implements(ptr, iface) || types.Implements(obj.Type(), iface)
			switch {
			case offered[c.Name] && !implements:
				fmt.Fprintf(stderr, "%s: mechanism %s: *%s lacks capability %s that the spec declares%s\n", m.Package, m.Name, m.Type, c.Name, methodsDetail(ptr, iface))
				ok = false
			case !offered[c.Name] && implements:
				fmt.Fprintf(stderr, "%s: mechanism %s: *%s implements capability %s, which the spec does not declare for it\n", m.Package, m.Name, m.Type, c.Name)
				ok = false
			}
		}
		if mi, _ := contractPkg.Scope().Lookup("Mechanism").Type().Underlying().(*types.Interface); mi != nil && !types.Implements(ptr, mi) {
			fmt.Fprintf(stderr, "%s: mechanism %s: *%s does not implement memapi.Mechanism%s\n", m.Package, m.Name, m.Type, methodsDetail(ptr, mi))
			ok = false
		}
	}
	return ok
}

// methodsDetail lists every method of iface that t lacks and every one it
// has with another signature, by name: " (missing A, B;
// wrong type: C)", or "" when it lacks none. (The compiler names only the
// first missing method of each interface.)
func methodsDetail(t types.Type, iface *types.Interface) string {
	var missing, wrong []string
	for i := 0; i < iface.NumMethods(); i++ {
		want := iface.Method(i)
		obj, _, _ := types.LookupFieldOrMethod(t, false, want.Pkg(), want.Name())
		got, ok := obj.(*types.Func)
		switch {
		case !ok:
			missing = append(missing, want.Name())
		case !types.Identical(got.Type(), want.Type()):
			wrong = append(wrong, want.Name())
		}
	}
	var parts []string
	if len(missing) > 0 {
		parts = append(parts, "missing "+strings.Join(missing, ", "))
	}
	if len(wrong) > 0 {
		parts = append(parts, "wrong type: "+strings.Join(wrong, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}
