package gen

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestConformanceCompilesForSmallerSpecs generates the contract and the
// conformance suite for the golden valid_tiny spec (no SharedMapping, no
// views) into a scratch module and vets it: templates whose requirements a
// spec does not meet are left out, and what remains must compile.
func TestConformanceCompilesForSmallerSpecs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a scratch module")
	}
	data, err := os.ReadFile(filepath.Join("testdata", "valid_tiny", "spec.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load(specName, data)
	if err != nil {
		t.Fatal(err)
	}
	files, err := Generate(s, Config{Module: "example.com/tiny"})
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	dir := t.TempDir()
	var conf []string
	for rel, b := range files {
		if !strings.HasPrefix(rel, s.Packages.Contract+"/") && !strings.HasPrefix(rel, s.Packages.Conformance+"/") {
			continue
		}
		if strings.HasPrefix(rel, s.Packages.Conformance+"/") {
			conf = append(conf, filepath.Base(rel))
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, b, 0o644))
	}
	for _, f := range conf {
		if strings.Contains(f, "sharedmapping") {
			t.Errorf("%s generated for a spec without SharedMapping", f)
		}
	}
	if len(conf) < 4 {
		t.Fatalf("only %v generated for the conformance package", conf)
	}
	must(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/tiny\n\ngo 1.24\n"), 0o644))
	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go vet of the generated tiny module: %v\n%s", err, out)
	}
}

// TestConformanceNeedsFixtures: a spec method the suite has no fixture for is
// a generation error naming the method, not a silently thinner suite.
func TestConformanceNeedsFixtures(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "valid_tiny", "spec.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(data), "      CommittedBytes:\n", "      Touch:\n        doc: Touch pokes a reservation.\n        params: {res: Reservation}\n        returns: [error]\n        accounting: none\n        requires: [live(res)]\n      CommittedBytes:\n", 1)
	if src == string(data) {
		t.Fatal("could not add a method to the tiny spec")
	}
	s, err := Load(specName, []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Generate(s, Config{Module: "example.com/tiny"})
	if err == nil || !strings.Contains(err.Error(), "VirtualBacking.Touch") || !strings.Contains(err.Error(), "no fixture") {
		t.Fatalf("Generate = %v, want an error naming VirtualBacking.Touch and its missing fixture", err)
	}
}
