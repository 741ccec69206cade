package gen

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestFakesFollowTheSpec adds a method to the spec and checks that the fakes
// grow it: recorded, counted, stubbable, faultable, reporting ErrUnsupported
// from the state model (which has no behaviour for it) — and that the
// contract and the fakes still compile.
func TestFakesFollowTheSpec(t *testing.T) {
	data, err := os.ReadFile("../spec/capabilities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "      CommittedBytes:\n"
	if !strings.Contains(string(data), anchor) {
		t.Fatalf("spec has no %q to insert before", anchor)
	}
	added := strings.Replace(string(data), anchor, `      Trim:
        doc: Trim is a method the fakes have no behaviour for.
        params: {ctx: context.Context, res: Reservation, keep: Bytes}
        returns: [Bytes, error]
        accounting: query
        requires: [live(res)]
`+anchor, 1)
	s, err := Load("spec/capabilities.yaml", []byte(added))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	// Only the contract and the fakes: other emitters may rightly refuse a
	// method they have no behaviour for (the conformance suite wants a fixture).
	files := emitOnly(t, s, fakesEmitter)
	// Signatures past 100 columns put one item per line; join them back.
	mech := oneLineLists(string(files["fakes/mechanism.go"]))
	for _, want := range []string{
		"func (fake *Mechanism) Trim(ctx context.Context, res *memapi.Reservation, keep memapi.Bytes) (memapi.Bytes, error)",
		"func (fake *Mechanism) TrimCallCount() int",
		"func (fake *Mechanism) TrimArgsForCall(i int) (context.Context, *memapi.Reservation, memapi.Bytes)",
		"func (fake *Mechanism) TrimReturns(result1 memapi.Bytes, result2 error)",
		"func (fake *Mechanism) TrimReturnsOnCall(i int, result1 memapi.Bytes, result2 error)",
		"func (fake *Mechanism) TrimCalls(stub func(context.Context, *memapi.Reservation, memapi.Bytes) (memapi.Bytes, error))",
		`errNoBehaviour("VirtualBacking.Trim")`,
		`fake.absent("VirtualBacking", "Trim")`,
		`"Trim"`, // in mechanismFaultMethods
	} {
		if !strings.Contains(mech, want) {
			t.Errorf("fakes/mechanism.go lacks %s", want)
		}
	}
	vetFakes(t, s, files)
}

// TestFakesFitSmallerSpecs generates the fakes for specs without some
// optional capabilities and checks that they build: the state model of a
// capability is written only when the spec declares it.
func TestFakesFitSmallerSpecs(t *testing.T) {
	tiny, err := os.ReadFile("testdata/valid_tiny/spec.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load("spec/capabilities.yaml", tiny)
	if err != nil {
		t.Fatalf("load tiny: %v", err)
	}
	t.Run("no-SharedMapping", func(t *testing.T) {
		files := emitOnly(t, s, fakesEmitter)
		if _, ok := files["fakes/shared_mapping_state.go"]; ok {
			t.Error("the SharedMapping state model was written for a spec without SharedMapping")
		}
		vetFakes(t, s, files)
	})
	t.Run("allocator-only", func(t *testing.T) {
		s.Capabilities = s.Capabilities[:1]
		s.Mechanisms = nil
		files := emitOnly(t, s, fakesEmitter)
		if _, ok := files["fakes/virtual_backing_state.go"]; ok {
			t.Error("the VirtualBacking state model was written for a spec without VirtualBacking")
		}
		vetFakes(t, s, files)
	})
}

// vetFakes writes the contract and the fakes into a scratch module and runs
// go vet on the fakes.
func vetFakes(t *testing.T, s *Spec, files map[string][]byte) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil || testing.Short() {
		t.Skip("compiling the generated fakes needs the go command and no -short")
	}
	dir := t.TempDir()
	write := func(rel string, b []byte) {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", []byte("module github.com/memgen/memgen\n\ngo 1.26\n"))
	for rel, b := range files {
		if strings.HasPrefix(rel, s.Packages.Contract+"/") || strings.HasPrefix(rel, s.Packages.Fakes+"/") {
			write(rel, b)
		}
	}
	cmd := exec.Command("go", "vet", "./"+s.Packages.Fakes)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generated fakes do not build: %v\n%s", err, out)
	}
}

// emitOnly runs the given emitters, and those they require, and returns
// their files as Generate would.
func emitOnly(t *testing.T, s *Spec, es ...*emitter) map[string][]byte {
	t.Helper()
	g := newGen(s, Config{Module: "github.com/memgen/memgen"})
	g.run(es)
	out := g.render()
	if len(g.errs.list) > 0 {
		t.Fatalf("emit: %v", g.errs.list.sorted())
	}
	return out
}

// oneLineLists joins parameter and result lists that gofmt-style code puts
// one item per line back onto one line.
func oneLineLists(src string) string {
	src = regexp.MustCompile(`\(\n\t+`).ReplaceAllString(src, "(")
	src = regexp.MustCompile(`,\n\)`).ReplaceAllString(src, ")")
	return regexp.MustCompile(`,\n\t+`).ReplaceAllString(src, ", ")
}
