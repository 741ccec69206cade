package main

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/memgen/memgen/gen"
)

// tinySpec declares two mechanisms: plain (mechanisms/plain, type Mechanism,
// DeviceAllocator only) and arena (mechanisms/arena, type Arena,
// DeviceAllocator and VirtualBacking).
const tinySpec = "../../gen/testdata/valid_tiny/spec.yaml"

// mechanismSource writes a hand-written mechanism package whose type has
// every method of the named capabilities, derived from the spec so the test
// follows the spec's signatures.
func mechanismSource(t *testing.T, root, pkgDir, typ string, caps ...string) {
	t.Helper()
	data, err := os.ReadFile(tinySpec)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gen.Load("spec/capabilities.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	goType := func(n string) string {
		switch {
		case strings.Contains(n, ".") || strings.ContainsAny(n, "[<") || n == "error" || n == "bool" || n == "int" || n == "string" || n == "uint64":
			return n
		case s.Type(n) != nil && s.Type(n).Kind == gen.KindHandle:
			return "*memapi." + n
		}
		return "memapi." + n
	}
	var b strings.Builder
	pkg := pkgDir[strings.LastIndex(pkgDir, "/")+1:]
	fmt.Fprintf(&b, "// Package %s is a scratch mechanism for memgen's implementation check.\npackage %s\n\n", pkg, pkg)
	b.WriteString("import (\n\t\"context\"\n\n\t\"github.com/memgen/memgen/generated/memapi\"\n)\n\n")
	b.WriteString("var _ context.Context\n\n")
	fmt.Fprintf(&b, "type %s struct{}\n\n", typ)
	fmt.Fprintf(&b, "func (m *%s) offers(memapi.Capability) bool { return true }\n\n", typ)
	for _, name := range caps {
		c := s.Capability(name)
		if c == nil {
			t.Fatalf("no capability %s", name)
		}
		for _, m := range c.Methods {
			var ps, rs []string
			for _, p := range m.Params {
				ps = append(ps, p.Name+" "+goType(p.Type))
			}
			for _, r := range m.Returns {
				rs = append(rs, goType(r.Type))
			}
			fmt.Fprintf(&b, "func (m *%s) %s(%s) (%s) { panic(\"scratch\") }\n\n", typ, m.Name, strings.Join(ps, ", "), strings.Join(rs, ", "))
		}
	}
	writeFile(t, root, pkgDir+"/"+strings.ToLower(typ)+".go", b.String())
}

// TestImplementationCheck: memgen check loads each mechanism package the
// spec names and fails, naming the capability, when its type implements one
// too many or one too few; a declared package that does not exist yet is only
// a warning.
func TestImplementationCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("loads packages with the go command")
	}
	check := func(t *testing.T, root string) (int, string, string) {
		t.Helper()
		code, stdout, stderr := memgen(t, "generate", "-root", root)
		wantCode(t, code, exitOK, stdout, stderr)
		return memgen(t, "check", "-root", root)
	}

	t.Run("exact, other package missing", func(t *testing.T) {
		root := newModule(t, tinySpec)
		mechanismSource(t, root, "mechanisms/plain", "Mechanism", "DeviceAllocator")
		code, stdout, stderr := check(t, root)
		wantCode(t, code, exitOK, stdout, stderr)
		wantContains(t, stderr, "warning: mechanism arena: package mechanisms/arena does not exist yet")
		if strings.Contains(stderr, "plain") {
			t.Errorf("plain is exact, yet:\n%s", stderr)
		}
		// The glue was generated beside the hand-written code, and for the
		// mechanism not written yet too, saying what to write; generate said so.
		wantContains(t, readFile(t, root, "mechanisms/plain/zz_generated.memgen.go"), gen.HeaderPrefix)
		wantContains(t, readFile(t, root, "mechanisms/arena/zz_generated.memgen.go"), gen.HeaderPrefix, "The hand-written half is type Arena")
		_, _, genErr := memgen(t, "generate", "-root", root)
		wantContains(t, genErr, "mechanism arena: wrote mechanisms/arena/zz_generated.memgen.go; write type Arena")
		if strings.Contains(genErr, "mechanism plain") {
			t.Errorf("generate noted plain, which is written:\n%s", genErr)
		}
	})

	t.Run("one capability too many", func(t *testing.T) {
		root := newModule(t, tinySpec)
		mechanismSource(t, root, "mechanisms/plain", "Mechanism", "DeviceAllocator", "VirtualBacking")
		code, stdout, stderr := check(t, root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, "mechanisms/plain: mechanism plain: *Mechanism implements capability VirtualBacking, which the spec does not declare for it")
	})

	t.Run("one capability too few", func(t *testing.T) {
		root := newModule(t, tinySpec)
		mechanismSource(t, root, "mechanisms/plain", "Mechanism", "DeviceAllocator")
		mechanismSource(t, root, "mechanisms/arena", "Arena", "DeviceAllocator")
		code, stdout, stderr := check(t, root)
		wantCode(t, code, exitSpec, stdout, stderr)
		// Every missing method is named, not only the first, as the
		// compiler would.
		wantContains(t, stderr, "mechanisms/arena: mechanism arena: *Arena lacks capability VirtualBacking that the spec declares (missing "+strings.Join(capabilityMethods(t, "VirtualBacking"), ", ")+")")
		if strings.Contains(stderr, "mechanism plain:") {
			t.Errorf("plain is exact, yet:\n%s", stderr)
		}
	})

	t.Run("does not build", func(t *testing.T) {
		root := newModule(t, tinySpec)
		mechanismSource(t, root, "mechanisms/plain", "Mechanism", "DeviceAllocator")
		writeFile(t, root, "mechanisms/plain/broken.go", "package plain\n\nfunc broken() { undefinedThing() }\n")
		code, stdout, stderr := check(t, root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, "mechanisms/plain/broken.go:3:17: undefined: undefinedThing", "mechanisms/plain: mechanism plain does not build (1 error above)")
	})

	t.Run("declared type missing", func(t *testing.T) {
		root := newModule(t, tinySpec)
		mechanismSource(t, root, "mechanisms/plain", "Other", "DeviceAllocator")
		code, stdout, stderr := check(t, root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, "mechanisms/plain: mechanism plain: type Mechanism not found")
	})
}

// capabilityMethods lists the methods of a capability of the tiny spec,
// sorted (go/types orders an interface's methods by name).
func capabilityMethods(t *testing.T, name string) []string {
	t.Helper()
	data, err := os.ReadFile(tinySpec)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gen.Load("spec/capabilities.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range s.Capability(name).Methods {
		out = append(out, m.Name)
	}
	sort.Strings(out)
	if len(out) < 2 {
		t.Fatalf("capability %s has %d methods: the test needs several", name, len(out))
	}
	return out
}
