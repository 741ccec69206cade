package gen

import (
	"go/token"
	"path"
	"regexp"
	"strings"
)

// The package layout the generator writes: the generated packages' fixed Go
// names (the templates and the other emitters refer to them by these names,
// so each directory must end in its package's name), and the rules every
// module-relative directory of the spec obeys.
var (
	generatedPackageNames = map[string]string{
		"contract":    "memapi",
		"checked":     "checked",
		"conformance": "conformance",
		"fakes":       "fakes",
	}
	packageNameRE = regexp.MustCompile(`^[a-z][a-z0-9]*$`)
	dirElemRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

	// importedNames are the packages generated method bodies refer to by
	// name; a parameter of that name would hide the package.
	importedNames = []string{
		"atomic", "bytes", "checked", "conformance", "context", "errors", "fakes", "fmt",
		"memapi", "os", "reflect", "slices", "sort", "strings", "sync", "testing", "time",
	}
	// predeclared are Go's predeclared identifiers; a parameter of that name
	// would hide the type, constant or builtin the generated code uses.
	predeclared = []string{
		"any", "append", "bool", "byte", "cap", "clear", "close", "comparable", "complex",
		"complex128", "complex64", "copy", "delete", "error", "false", "float32", "float64",
		"imag", "int", "int16", "int32", "int64", "int8", "iota", "len", "make", "max", "min",
		"new", "nil", "panic", "print", "println", "real", "recover", "rune", "string", "true",
		"uint", "uint16", "uint32", "uint64", "uint8", "uintptr",
	}
)

// badDir says why dir cannot be a package directory of the module, or "".
// The go command ignores directories named testdata or starting with "." or
// "_", and the last element is the package name.
func badDir(dir string) string {
	if dir == "" || strings.HasPrefix(dir, "/") || strings.HasSuffix(dir, "/") || path.Clean(dir) != dir {
		return "is not a clean module-relative directory (like mechanisms/cpu)"
	}
	for _, el := range strings.Split(dir, "/") {
		switch {
		case el == "..":
			return "leaves the module"
		case el == "testdata" || !dirElemRE.MatchString(el):
			return "has element " + `"` + el + `"` + ", which the go command ignores or rejects"
		}
	}
	if base := path.Base(dir); !packageNameRE.MatchString(base) || token.IsKeyword(base) {
		return "ends in " + `"` + base + `"` + ", which is not a Go package name (lower-case letters and digits, starting with a letter, not a keyword)"
	}
	return ""
}

// validatePackages checks the generated packages' directories: valid, each
// ending in the name the generator gives the package, and one package per
// directory.
func validatePackages(s *Spec, e *errs) {
	ps := s.Packages
	seen := map[string]string{}
	for _, k := range specKeys["packages"] {
		dir := map[string]string{"contract": ps.Contract, "checked": ps.Checked, "conformance": ps.Conformance, "fakes": ps.Fakes}[k]
		p, ok := s.pkgPos[k]
		if !ok || dir == "" {
			continue // missing or not a string: reported by the loader
		}
		if why := badDir(dir); why != "" {
			e.add(p, "packages.%s: %q %s", k, dir, why)
			continue
		}
		if want := generatedPackageNames[k]; path.Base(dir) != want {
			e.add(p, "packages.%s: %q must end in %q: the generator writes package %s there, and Go code expects a package named after its directory", k, dir, want, want)
		}
		if other, ok := seen[dir]; ok {
			e.add(p, "packages.%s: %q is also packages.%s: two generated packages cannot share a directory", k, dir, other)
			continue
		}
		seen[dir] = k
	}
}

// validateMechanisms checks each mechanism's offers, device, granularity,
// type and package: one mechanism per package, never inside a generated one.
func validateMechanisms(s *Spec, e *errs) {
	generated := map[string]string{}
	for k, dir := range map[string]string{"contract": s.Packages.Contract, "checked": s.Packages.Checked, "conformance": s.Packages.Conformance, "fakes": s.Packages.Fakes} {
		if dir != "" {
			generated[dir] = k
		}
	}
	byPackage := map[string]*Mechanism{}
	for _, m := range s.Mechanisms {
		offered := map[string]bool{}
		for i, o := range m.Offers {
			offered[o] = true
			if s.caps[o] == nil && s.sectionOK("capabilities") {
				e.add(m.OfferPos[i], "mechanism %s: offers undeclared capability %q", m.Name, o)
			}
		}
		if s.sectionOK("capabilities") && m.Offers != nil {
			for _, c := range s.Capabilities {
				if c.Required && !offered[c.Name] {
					e.add(m.Pos, "mechanism %s: does not offer required capability %s", m.Name, c.Name)
				}
			}
		}
		if m.Granularity != "" && !contains(granularities, m.Granularity) {
			e.add(m.GranularityPos, "mechanism %s: unknown granularity %q (want %s)", m.Name, m.Granularity, strings.Join(granularities, ", "))
		}
		if m.Type != "" && !identRE.MatchString(m.Type) {
			e.add(m.TypePos, "mechanism %s: type %q is not an exported Go name", m.Name, m.Type)
		}
		if dk := s.types["DeviceKind"]; dk != nil && m.Device != "" && !dk.hasValue(m.Device) {
			e.add(m.DevicePos, "mechanism %s: device %q is not a DeviceKind value", m.Name, m.Device)
		}
		if m.Package == "" {
			continue
		}
		if why := badDir(m.Package); why != "" {
			e.add(m.PackagePos, "mechanism %s: package %q %s", m.Name, m.Package, why)
			continue
		}
		if k, ok := generated[m.Package]; ok {
			e.add(m.PackagePos, "mechanism %s: package %q is the generated %s package: a mechanism lives in a package of its own", m.Name, m.Package, k)
		}
		if prev := byPackage[m.Package]; prev != nil {
			e.add(m.PackagePos, "mechanism %s: package %q already holds mechanism %s (%d:%d): one mechanism per package", m.Name, m.Package, prev.Name, prev.Pos.Line, prev.Pos.Col)
			continue
		}
		byPackage[m.Package] = m
	}
}

// badParamName says why a spec parameter name would break the generated
// code, or "": parameters keep their spec names in every generated body.
// capability says whether the method is a capability's, whose bodies the
// checked wrapper and the conformance suite generate.
func badParamName(n string, capability bool) string {
	switch {
	case capability && (contains(checkedLocals, n) || contains(conformanceLocals, n)):
		return "is a local name of the generated checked wrapper or conformance suite"
	case token.IsKeyword(n):
		return "is a Go keyword"
	case contains(predeclared, n):
		return "is a Go predeclared identifier, which generated code needs"
	case contains(importedNames, n):
		return "is the name of a package the generated code imports"
	}
	return ""
}
