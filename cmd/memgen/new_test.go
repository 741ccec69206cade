package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNewMechanism: memgen new mechanism adds the spec entry, writes a
// package that compiles and passes memgen check at once, and whose
// conformance test fails naming every method still to be written.
func TestNewMechanism(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests the new package with the go command")
	}
	root := newModule(t, "")
	code, stdout, stderr := memgen(t, "new", "mechanism", "arena", "-root", root, "-offers", "DeviceAllocator,VirtualBacking", "-doc", "Arena memory: the test's.")
	wantCode(t, code, exitOK, stdout, stderr)
	wantContains(t, stdout, "memgen new: mechanism arena: added to spec/capabilities.yaml; wrote mechanisms/arena (conformance_test.go, context.go, doc.go, mechanism.go, virtualbacking.go)")
	spec := readFile(t, root, "spec/capabilities.yaml")
	wantContains(t, spec, "  arena:\n    package: mechanisms/arena\n    type: Mechanism\n    device: Host\n    offers: [DeviceAllocator, VirtualBacking]\n    granularity: page\n    doc: 'Arena memory: the test''s.'\n\ninvariants:")
	wantContains(t, readFile(t, root, "mechanisms/arena/zz_generated.memgen.go"), `const SpecName memapi.MechanismID = "arena"`)

	code, stdout, stderr = memgen(t, "check", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)

	test := exec.Command("go", "test", "-count=1", "./mechanisms/arena/")
	test.Dir = root
	out, err := test.CombinedOutput()
	if err == nil {
		t.Fatalf("the starting point passed conformance, with nothing written:\n%s", out)
	}
	for _, op := range []string{"DeviceAllocator.Allocate", "VirtualBacking.Reserve", "DeviceContext.NewStream"} {
		wantContains(t, string(out), "not written yet: memgen new wrote a starting point; write "+op+" in mechanisms/arena/")
	}
	if strings.Contains(string(out), "SharedMapping/") && !strings.Contains(string(out), "absent-means-unsupported") {
		t.Errorf("SharedMapping, not offered, was tested as offered:\n%s", out)
	}
}

// TestNewMechanismRefuses: a name the spec has, a name that is no package
// name, an entry the spec rejects and a package directory holding Go files
// are refused, and nothing is written.
func TestNewMechanismRefuses(t *testing.T) {
	root := newModule(t, tinySpec)
	writeFile(t, root, "mechanisms/taken/taken.go", "package taken\n")
	before := snapshot(t, root)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"plain"}, exitRefused, "the spec already declares mechanism plain (package mechanisms/plain): nothing written"},
		{[]string{"Bad-Name"}, exitUsage, `mechanism name "Bad-Name": want lower-case letters and digits`},
		{[]string{"gpu", "-device", "TPU"}, exitUsage, "the spec rejects the entry the flags make, nothing written"},
		{[]string{"gpu", "-offers", "VirtualBacking"}, exitUsage, "the spec rejects the entry the flags make, nothing written"},
		{[]string{"taken"}, exitRefused, "mechanisms/taken already holds Go files (taken.go): nothing written"},
		{[]string{"gpu", "-package", "mechanisms/taken"}, exitRefused, "mechanisms/taken already holds Go files"},
		{nil, exitUsage, "want: memgen new mechanism NAME"},
	} {
		args := append([]string{"new", "mechanism"}, c.args...)
		code, stdout, stderr := memgen(t, append(args, "-root", root)...)
		wantCode(t, code, c.code, stdout, stderr)
		wantContains(t, stderr, c.want)
	}
	sameTree(t, before, snapshot(t, root))

	// A write that fails half way (a file where a directory must go) takes
	// back what was written: the spec and the tree are as before.
	writeFile(t, root, "mechanisms/blocker", "not a directory\n")
	before = snapshot(t, root)
	code, stdout, stderr := memgen(t, "new", "mechanism", "gpu", "-package", "mechanisms/blocker/gpu", "-root", root)
	wantCode(t, code, exitSpec, stdout, stderr)
	wantContains(t, stderr, "not a directory")
	sameTree(t, before, snapshot(t, root))
}

// TestInsertMechanism: the entry goes at the end of the mechanisms:
// section, before the blank lines and comments leading to the next key;
// every other byte stays.
func TestInsertMechanism(t *testing.T) {
	spec := "version: 1\n# head\nmechanisms:\n  a:\n    package: x\n\n# about invariants\ninvariants:\n  i: {}\n"
	got, err := insertMechanism([]byte(spec), []byte("  b:\n    package: y\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "version: 1\n# head\nmechanisms:\n  a:\n    package: x\n  b:\n    package: y\n\n# about invariants\ninvariants:\n  i: {}\n"
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	got, err = insertMechanism([]byte("mechanisms:\n  a: {}"), []byte("  b: {}\n"))
	if err != nil || string(got) != "mechanisms:\n  a: {}\n  b: {}\n" {
		t.Errorf("at the end of a file without a final newline: %q, %v", got, err)
	}
	if _, err := insertMechanism([]byte("version: 1\n"), nil); err == nil {
		t.Error("a spec without a mechanisms: section was accepted")
	}
}
