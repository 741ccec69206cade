package gen

import (
	"bytes"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const (
	realSpec   = "../spec/capabilities.yaml"
	realModule = "github.com/memgen/memgen"
)

func loadReal(t testing.TB) *Spec {
	t.Helper()
	data, err := os.ReadFile(realSpec)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load(specName, data)
	if err != nil {
		t.Fatalf("the real spec does not load:\n%v", err)
	}
	return s
}

// TestRealSpecDeterministic generates the real spec twice from two separate
// loads and wants the same bytes, gofmt-clean Go, memgen's header, naming
// the spec and the emitter, on every file and no version string anywhere in
// a header.
func TestRealSpecDeterministic(t *testing.T) {
	cfg := Config{Module: realModule, Root: ".."}
	a, err := Generate(loadReal(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Generate(loadReal(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("runs produced %d and %d files", len(a), len(b))
	}
	if _, ok := a[DocFile]; !ok {
		t.Errorf("%s is not generated", DocFile)
	}
	version := regexp.MustCompile(`(?i)\bv?\d+\.\d+(\.\d+)?\b|version`)
	for _, rel := range sortedKeys(a) {
		if !bytes.Equal(a[rel], b[rel]) {
			t.Errorf("%s: not deterministic: %s", rel, firstDiff(a[rel], b[rel]))
		}
		first, _, _ := strings.Cut(string(a[rel]), "\n")
		if !provenanceLine.MatchString(first) {
			t.Errorf("%s: first line %q names no spec and emitter", rel, first)
		}
		switch path.Ext(rel) {
		case ".go":
			if !strings.HasPrefix(first, HeaderPrefix) {
				t.Errorf("%s: first line %q, want it to start with %q", rel, first, HeaderPrefix)
			}
			src, err := format.Source(a[rel])
			if err != nil {
				t.Errorf("%s: does not parse: %v", rel, err)
			} else if !bytes.Equal(src, a[rel]) {
				t.Errorf("%s: not gofmt-clean: %s", rel, firstDiff(a[rel], src))
			}
		case ".h": // C and C++ take the Go header's // comment as it is
			if !strings.HasPrefix(first, HeaderPrefix) {
				t.Errorf("%s: first line %q, want it to start with %q", rel, first, HeaderPrefix)
			}
		case ".md":
			if !strings.HasPrefix(first, MarkdownHeaderPrefix) || !strings.HasSuffix(first, " -->") {
				t.Errorf("%s: first line %q, want an HTML comment starting with %q", rel, first, MarkdownHeaderPrefix)
			}
		default:
			t.Errorf("%s: unexpected kind of generated file", rel)
		}
		if version.MatchString(first) {
			t.Errorf("%s: header carries a version: %q", rel, first)
		}
	}
}

// TestReservedNamesComplete keeps reservedNames in step with the contract
// emitter: every exported top-level identifier of the generated contract is
// either derived from a spec declaration or reserved, so the validator
// rejects a spec that would redeclare it.
func TestReservedNamesComplete(t *testing.T) {
	s := loadReal(t)
	files, err := Generate(s, Config{Module: realModule})
	if err != nil {
		t.Fatal(err)
	}
	derived := map[string]bool{}
	for _, ty := range s.Types {
		derived[ty.Name] = true
		for _, v := range ty.Values {
			derived[ty.Name+v.Name] = true
		}
	}
	for _, d := range s.Errors {
		derived[d.Name] = true
	}
	for _, i := range s.Interfaces {
		derived[i.Name] = true
	}
	for _, c := range s.Capabilities {
		derived[c.Name] = true
		derived[capConst(c)] = true
		derived["Require"+c.Name] = true
	}
	reserved := map[string]bool{}
	for _, n := range reservedNames {
		reserved[n] = true
	}
	prefix := s.Packages.Contract + "/"
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for rel, src := range files {
		if !strings.HasPrefix(rel, prefix) || strings.Contains(rel[len(prefix):], "/") || path.Ext(rel) != ".go" {
			continue
		}
		f, err := parser.ParseFile(fset, rel, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range topLevel(f) {
			if !ast.IsExported(n) {
				continue
			}
			seen[n] = true
			if !derived[n] && !reserved[n] {
				t.Errorf("%s declares %s, which is neither derived from the spec nor in reservedNames (validate.go)", rel, n)
			}
		}
	}
	for _, n := range reservedNames {
		if !seen[n] {
			t.Errorf("reservedNames lists %s, which the contract no longer declares", n)
		}
	}
}

func topLevel(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				names = append(names, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					names = append(names, sp.Name.Name)
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	return names
}

// TestGoldenCompiles builds and vets the valid golden cases' generated code
// in a scratch module with the real module's requirements: golden files that
// gofmt accepts but the compiler rejects would make a useless reference.
func TestGoldenCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	gosum, _ := os.ReadFile("../go.sum")
	mod := regexp.MustCompile(`(?m)^module .*$`).ReplaceAll(gomod, []byte("module "+goldenModule))
	for _, dir := range goldenCases(t) {
		exp := filepath.Join(dir, "expected")
		if _, err := os.Stat(exp); err != nil {
			continue
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tmp := t.TempDir()
			if err := os.CopyFS(tmp, os.DirFS(exp)); err != nil {
				t.Fatal(err)
			}
			// The tripwire test reads the spec at its conventional place.
			spec, err := os.ReadFile(filepath.Join(dir, "spec.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			ls, err := Load(specName, spec)
			if err != nil {
				t.Fatal(err)
			}
			extra := map[string][]byte{"go.mod": mod, "go.sum": gosum, "spec/capabilities.yaml": spec}
			for rel, src := range mechanismStubs(ls, goldenModule) {
				extra[rel] = src
			}
			for name, data := range extra {
				p := filepath.Join(tmp, filepath.FromSlash(name))
				must(t, os.MkdirAll(filepath.Dir(p), 0o755))
				must(t, os.WriteFile(p, data, 0o644))
			}
			var pkgs []string
			filepath.WalkDir(tmp, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") {
					rel, _ := filepath.Rel(tmp, filepath.Dir(p))
					pkgs = append(pkgs, "./"+filepath.ToSlash(rel))
				}
				return nil
			})
			sort.Strings(pkgs)
			pkgs = compactStrings(pkgs)
			cmd := exec.Command("go", append([]string{"vet", "-mod=mod"}, pkgs...)...)
			cmd.Dir = tmp
			cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go vet %v: %v\n%s", pkgs, err, out)
			}
			// The tripwire passes on the spec the files came from.
			cmd = exec.Command("go", "test", "-mod=mod", "-count=1", "-run", "TestSpecDigest", "./"+s2p(filepath.Dir(findFile(t, tmp, "digest_test.go")), tmp))
			cmd.Dir = tmp
			cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("tripwire: %v\n%s", err, out)
			}
		})
	}
}

func compactStrings(xs []string) []string {
	out := xs[:0]
	for i, x := range xs {
		if i == 0 || x != xs[i-1] {
			out = append(out, x)
		}
	}
	return out
}

func findFile(t *testing.T, root, name string) string {
	t.Helper()
	var found string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			found = p
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no %s under %s", name, root)
	}
	return found
}

// s2p makes p relative to root, slash-separated.
func s2p(p, root string) string {
	rel, _ := filepath.Rel(root, p)
	return filepath.ToSlash(rel)
}
