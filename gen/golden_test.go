package gen

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/ from the current generator")

// specName is the file name errors are reported against, as memgen does.
const specName = "spec/capabilities.yaml"

// goldenModule is the module path the valid cases are generated for.
const goldenModule = "example.com/golden"

// TestGolden runs every case under testdata/<case>/: spec.yaml is loaded and
// generated (against root/ as the module root when the case has one), and
// either fails, at load or generation, with exactly the lines of
// want_errors.txt, or generates exactly the files under expected/.
// `go test ./gen -update` rewrites them.
func TestGolden(t *testing.T) {
	cases := goldenCases(t)
	if len(cases) == 0 {
		t.Fatal("no golden cases under testdata/")
	}
	for _, dir := range cases {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "spec.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			s, err := Load(specName, data)
			if err != nil {
				goldenErrors(t, dir, err)
				return
			}
			// A case with a root/ folder generates against it as the module
			// root: hand-written mechanism files for the generator to read.
			cfg := Config{Module: goldenModule}
			if _, err := os.Stat(filepath.Join(dir, "root")); err == nil {
				cfg.Root = filepath.Join(dir, "root")
			}
			files, err := Generate(s, cfg)
			if err != nil {
				goldenErrors(t, dir, err)
				return
			}
			goldenFiles(t, dir, files)
		})
	}
}

// goldenCases lists the case directories: every folder of testdata holding a
// spec.yaml (the fuzz corpus lives beside them and has none).
func goldenCases(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		dir := filepath.Join("testdata", e.Name())
		if _, err := os.Stat(filepath.Join(dir, "spec.yaml")); e.IsDir() && err == nil {
			out = append(out, dir)
		}
	}
	return out
}

func goldenErrors(t *testing.T, dir string, err error) {
	t.Helper()
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("Load returned %T, want ErrorList: %v", err, err)
	}
	got := err.Error() + "\n"
	wantFile := filepath.Join(dir, "want_errors.txt")
	if *update {
		must(t, os.RemoveAll(filepath.Join(dir, "expected")))
		must(t, os.WriteFile(wantFile, []byte(got), 0o644))
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "expected")); err == nil {
		t.Fatalf("case expects generated files, but the spec failed to load:\n%s", got)
	}
	want, rerr := os.ReadFile(wantFile)
	if rerr != nil {
		t.Fatalf("spec failed to load and %v:\n%s", rerr, got)
	}
	if got != string(want) {
		t.Errorf("errors differ from %s (go test ./gen -update rewrites it)\n--- got\n%s--- want\n%s", wantFile, got, want)
	}
	for _, e := range list {
		if e.Pos.File != specName || e.Pos.Line <= 0 || e.Pos.Col <= 0 {
			t.Errorf("error without a proper position: %q", e.Error())
		}
	}
}

func goldenFiles(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	exp := filepath.Join(dir, "expected")
	if *update {
		must(t, os.RemoveAll(exp))
		must(t, os.Remove(filepath.Join(dir, "want_errors.txt")), os.ErrNotExist)
		for rel, data := range files {
			p := filepath.Join(exp, filepath.FromSlash(rel))
			must(t, os.MkdirAll(filepath.Dir(p), 0o755))
			must(t, os.WriteFile(p, data, 0o644))
		}
		return
	}
	if _, err := os.Stat(filepath.Join(dir, "want_errors.txt")); err == nil {
		t.Fatalf("case expects errors (want_errors.txt), but the spec loaded and generated %d files", len(files))
	}
	want := map[string][]byte{}
	err := filepath.WalkDir(exp, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(exp, p)
		want[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", exp, err)
	}
	for _, rel := range sortedKeys(files) {
		w, ok := want[rel]
		switch {
		case !ok:
			t.Errorf("%s: generated but not in %s (go test ./gen -update)", rel, exp)
		case !bytes.Equal(files[rel], w):
			t.Errorf("%s: differs from the golden file: %s", rel, firstDiff(files[rel], w))
		}
	}
	for _, rel := range sortedKeys(want) {
		if _, ok := files[rel]; !ok {
			t.Errorf("%s: in %s but no longer generated", rel, exp)
		}
	}
}

// firstDiff describes the first line where got and want differ.
func firstDiff(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl || i >= len(g) || i >= len(w) {
			return fmt.Sprintf("line %d:\n\tgot:  %q\n\twant: %q", i+1, gl, wl)
		}
	}
	return "identical lines, different bytes"
}

// must fails the test on err unless err matches one of the tolerated errors.
func must(t *testing.T, err error, tolerated ...error) {
	t.Helper()
	if err == nil {
		return
	}
	for _, e := range tolerated {
		if errors.Is(err, e) {
			return
		}
	}
	t.Fatal(err)
}

// TestGoldenCaseCount keeps the suite honest: the spec language's error
// paths are only as covered as the cases that exercise them.
func TestGoldenCaseCount(t *testing.T) {
	var valid, invalid []string
	for _, dir := range goldenCases(t) {
		if _, err := os.Stat(filepath.Join(dir, "want_errors.txt")); err == nil {
			invalid = append(invalid, filepath.Base(dir))
		} else {
			valid = append(valid, filepath.Base(dir))
		}
	}
	sort.Strings(invalid)
	if len(invalid) < 12 || len(valid) < 1 {
		t.Errorf("want at least 12 error cases and 1 valid case, have %d (%v) and %d (%v)", len(invalid), invalid, len(valid), valid)
	}
}
