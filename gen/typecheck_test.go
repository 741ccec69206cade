package gen

import (
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
)

// stdImporter resolves the standard library for typeCheck; it is shared, as
// loading export data is the slow part, and guarded, as importers are not
// safe for concurrent use.
var (
	stdMu       sync.Mutex
	stdImporter = importer.Default()
)

// typeCheck type-checks generated files with go/types as the packages of
// module they are: each directory one package (its _test.go files checked
// with it, or as the external test package), generated packages imported
// from one another, the standard library from its export data. Mechanism
// glue is checked against the stand-ins of mechanismStubs. It returns every
// type error, or nil.
func typeCheck(s *Spec, module string, files map[string][]byte) error {
	all := map[string][]byte{}
	for rel, src := range files {
		if strings.HasSuffix(rel, ".go") {
			all[rel] = src
		}
	}
	for rel, src := range mechanismStubs(s, module) {
		all[rel] = src
	}
	tc := &checker{module: module, fset: token.NewFileSet(), dirs: map[string][]*ast.File{}, tests: map[string][]*ast.File{}, pkgs: map[string]*types.Package{}}
	for _, rel := range sortedKeys(all) {
		f, err := parser.ParseFile(tc.fset, rel, all[rel], parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		dir := path.Dir(rel)
		if strings.HasSuffix(rel, "_test.go") {
			tc.tests[dir] = append(tc.tests[dir], f)
		} else {
			tc.dirs[dir] = append(tc.dirs[dir], f)
		}
	}
	stdMu.Lock()
	defer stdMu.Unlock()
	var errs []error
	for _, dir := range sortedDirs(tc.dirs) {
		if _, err := tc.Import(module + "/" + dir); err != nil {
			errs = append(errs, err)
		}
	}
	for _, dir := range sortedDirs(tc.tests) {
		var internal, external []*ast.File
		for _, f := range tc.tests[dir] {
			if strings.HasSuffix(f.Name.Name, "_test") {
				external = append(external, f)
			} else {
				internal = append(internal, f)
			}
		}
		if len(internal) > 0 {
			if _, err := tc.check(module+"/"+dir, append(append([]*ast.File(nil), tc.dirs[dir]...), internal...)); err != nil {
				errs = append(errs, err)
			}
		}
		if len(external) > 0 {
			if _, err := tc.check(module+"/"+dir+"_test", external); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

type checker struct {
	module string
	fset   *token.FileSet
	dirs   map[string][]*ast.File // non-test files per directory
	tests  map[string][]*ast.File
	pkgs   map[string]*types.Package
}

// Import resolves a generated package by checking it (once), and anything
// else from the standard library.
func (c *checker) Import(p string) (*types.Package, error) {
	if pkg, ok := c.pkgs[p]; ok {
		if pkg == nil {
			return nil, fmt.Errorf("import cycle through %s", p)
		}
		return pkg, nil
	}
	rel, ok := strings.CutPrefix(p, c.module+"/")
	if !ok {
		return stdImporter.Import(p)
	}
	files := c.dirs[rel]
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no generated package there", p)
	}
	c.pkgs[p] = nil
	pkg, err := c.check(p, files)
	c.pkgs[p] = pkg
	return pkg, err
}

func (c *checker) check(p string, files []*ast.File) (*types.Package, error) {
	var errs []error
	conf := types.Config{Importer: c, Error: func(err error) {
		if len(errs) < 10 {
			errs = append(errs, err)
		}
	}}
	pkg, _ := conf.Check(p, c.fset, files, nil)
	return pkg, errors.Join(errs...)
}

func sortedDirs(m map[string][]*ast.File) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// TestGeneratedTypeChecks type-checks what the real spec and every valid
// golden case generate, the property FuzzGenerate asserts of every spec the
// loader accepts.
func TestGeneratedTypeChecks(t *testing.T) {
	for _, c := range []struct{ name, file string }{{"real", realSpec}, {"valid_tiny", "testdata/valid_tiny/spec.yaml"}} {
		t.Run(c.name, func(t *testing.T) {
			s := loadFile(t, c.file)
			files, err := Generate(s, Config{Module: goldenModule})
			if err != nil {
				t.Fatal(err)
			}
			if err := typeCheck(s, goldenModule, files); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func loadFile(t *testing.T, file string) *Spec {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load(specName, data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTypeCheckCatches keeps typeCheck honest: a generated file with a type
// error, or glue whose mechanism lacks the offers hook, fails it.
func TestTypeCheckCatches(t *testing.T) {
	s := loadFile(t, "testdata/valid_tiny/spec.yaml")
	files, err := Generate(s, Config{Module: goldenModule})
	if err != nil {
		t.Fatal(err)
	}
	glue := "mechanisms/arena/" + GlueFile
	broken := map[string][]byte{}
	for rel, src := range files {
		broken[rel] = src
	}
	broken[glue] = []byte(strings.Replace(string(files[glue]), "return m, true", "return m, 1", 1))
	if err := typeCheck(s, goldenModule, broken); err == nil || !strings.Contains(err.Error(), glue) {
		t.Errorf("a type error in %s passed: %v", glue, err)
	}
	broken[glue] = []byte(strings.Replace(string(files[glue]), "m.offers(", "m.offered(", 1))
	if err := typeCheck(s, goldenModule, broken); err == nil {
		t.Errorf("a call of an undeclared method in %s passed", glue)
	}
}
