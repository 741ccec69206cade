// Command codefigures prints the figures the architecture notes compare
// between commits, for the Go tree at its argument (default "."): for each
// package, its lines of non-test Go that are neither blank nor only a
// comment, and its exported identifiers (exported top-level names plus the
// exported methods of exported types); then the ten longest functions. The
// generator's template directories count as one package, "gen (templates)";
// testdata is left out. Tab-separated: "pkg NAME LINES EXPORTED" and
// "fn NAME LINES".
//
//	go run ./internal/codefigures .
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	type pkg struct{ lines, exported int }
	pkgs := map[string]*pkg{}
	type fn struct {
		name string
		n    int
	}
	var fns []fn
	fset := token.NewFileSet()
	err := filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.IsDir() && (info.Name() == "testdata" || strings.HasPrefix(info.Name(), ".")) && p != root {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, _ := os.ReadFile(p)
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments)
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		if strings.Contains(rel, "tmpl") {
			rel = "gen (templates)"
		}
		k := pkgs[rel]
		if k == nil {
			k = &pkg{}
			pkgs[rel] = k
		}
		// lines: non-blank, not only a comment
		inBlock := false
		for _, l := range strings.Split(string(src), "\n") {
			t := strings.TrimSpace(l)
			if inBlock {
				if strings.Contains(t, "*/") {
					inBlock = false
				}
				continue
			}
			if t == "" || strings.HasPrefix(t, "//") {
				continue
			}
			if strings.HasPrefix(t, "/*") {
				if !strings.Contains(t, "*/") {
					inBlock = true
				}
				continue
			}
			k.lines++
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				name := d.Name.Name
				if d.Recv != nil {
					t := d.Recv.List[0].Type
					if s, ok := t.(*ast.StarExpr); ok {
						t = s.X
					}
					if ix, ok := t.(*ast.IndexExpr); ok {
						t = ix.X
					}
					if ix, ok := t.(*ast.IndexListExpr); ok {
						t = ix.X
					}
					recv := t.(*ast.Ident).Name
					name = recv + "." + name
					if d.Name.IsExported() && ast.IsExported(recv) {
						k.exported++
					}
				} else if d.Name.IsExported() {
					k.exported++
				}
				if d.Body != nil {
					n := fset.Position(d.End()).Line - fset.Position(d.Pos()).Line + 1
					fns = append(fns, fn{rel + ": " + name, n})
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							k.exported++
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								k.exported++
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "codefigures:", err)
		os.Exit(1)
	}
	var names []string
	for n := range pkgs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Printf("pkg\t%s\t%d\t%d\n", n, pkgs[n].lines, pkgs[n].exported)
	}
	sort.Slice(fns, func(a, b int) bool { return fns[a].n > fns[b].n || fns[a].n == fns[b].n && fns[a].name < fns[b].name })
	for i := 0; i < 10 && i < len(fns); i++ {
		fmt.Printf("fn\t%s\t%d\n", fns[i].name, fns[i].n)
	}
}
