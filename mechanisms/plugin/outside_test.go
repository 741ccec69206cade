package plugin

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// TestOutsidePlugin is a plugin author's view: a directory holding only the
// header and the author's source (testdata/minimal.c, the plugin of
// docs/cabi.md), built there with cc, loaded by path with no allow-list and
// nothing of it in the spec, passes the whole suite bare and checked, with
// the spec/... subtests run against its own descriptor (not skipped), the
// leak check and the stress included.
func TestOutsidePlugin(t *testing.T) {
	compiler := cc(t)
	dir := t.TempDir()
	hdr, err := os.ReadFile(filepath.Join(includeDir, "memgen", "mechanism.h"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("testdata/minimal.c")
	if err != nil {
		t.Fatal(err)
	}
	must(0, os.MkdirAll(filepath.Join(dir, "include", "memgen"), 0o755))
	must(0, os.WriteFile(filepath.Join(dir, "include", "memgen", "mechanism.h"), hdr, 0o644))
	must(0, os.WriteFile(filepath.Join(dir, "minimal.c"), src, 0o644))
	cmd := exec.Command(compiler, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fPIC", "-shared", "-pthread",
		"-Iinclude", "-o", "libminimal.so", "minimal.c")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	if _, declared := declaredPlugins["minimal"]; declared {
		t.Fatal("the spec lists a plugin named minimal: this test must load one the spec knows nothing of")
	}
	path := filepath.Join(dir, "libminimal.so")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if l.Name != "minimal" || l.Offers() != memapi.Of(memapi.CapDeviceAllocator) {
		t.Fatalf("loaded %v", l)
	}
	for _, wrapped := range []bool{false, true} {
		res := recordSuite(t, path, Options{Verify: true}, wrapped)
		if f := res.Failed(); len(f) > 0 {
			t.Fatalf("wrapped=%v: the suite fails %v:\n%s", wrapped, f, res.Report())
		}
		for _, n := range []string{"spec/name", "spec/offers", "spec/device", "spec/granularity", "leak/freed-range-unmapped", "concurrency/stress", "DeviceAllocator/Allocate/round-trip"} {
			if o, ok := res.Outcome(n); !ok || o.Skipped {
				t.Errorf("wrapped=%v: %s was skipped or did not run: %+v", wrapped, n, o)
			}
		}
		if !slices.Contains(res.Skipped(), "VirtualBacking/Reserve/zero-size") {
			t.Errorf("wrapped=%v: VirtualBacking subtests ran on a DeviceAllocator-only plugin", wrapped)
		}
	}
}

// TestDocsMinimalPlugin: the complete plugin docs/cabi.md shows is
// testdata/minimal.c, which TestOutsidePlugin builds and checks, and it
// stays within 150 lines.
func TestDocsMinimalPlugin(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cabi.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("testdata/minimal.c")
	if err != nil {
		t.Fatal(err)
	}
	const open = "```c\n/* minimal.c:"
	i := bytes.Index(doc, []byte(open))
	if i < 0 {
		t.Fatalf("docs/cabi.md has no code block starting %q", open)
	}
	block := doc[i+len("```c\n"):]
	block = block[:bytes.Index(block, []byte("```\n"))]
	if !bytes.Equal(block, src) {
		t.Errorf("the plugin in docs/cabi.md differs from testdata/minimal.c")
	}
	if n := strings.Count(string(src), "\n"); n > 150 {
		t.Errorf("testdata/minimal.c has %d lines, more than 150", n)
	}
}
