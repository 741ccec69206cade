package gen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestRenderTemplate(t *testing.T) {
	literals := substitutions{literals: map[string]string{
		strconv.Quote(tmplContract): strconv.Quote("example.com/x/api"),
		strconv.Quote(tmplModule):   strconv.Quote("example.com/x"),
	}, contract: map[string]string{"Grant": "Budget"}}
	declared := map[string]bool{"A": true, "A.M": true}
	const text = `//go:build memgentmpl

// memgen:needs A A.M

package fakes

import memapi "github.com/memgen/memgen/generated/memapi"

const module = "github.com/memgen/memgen"

// doc
// memgen:if A
// with A
// memgen:else
// without A
// memgen:end
type s struct {
	// memgen:if B
	b memapi.Bytes
	// memgen:end
	a int
	g memapi.Grant
	h Grant
	k other.Grant
}

var text = "github.com/memgen/memgen/generated/memapi/x"
`
	header := goHeader("spec/capabilities.yaml", "fakes", "gen/fakestmpl/x.go")
	out, ok, err := renderTemplate([]byte(text), header, "fk", declared, literals)
	if err != nil || !ok {
		t.Fatalf("renderTemplate: ok=%v err=%v", ok, err)
	}
	got := string(out)
	for _, want := range []string{
		header + "\n\npackage fk\n",
		`import memapi "example.com/x/api"`,
		`const module = "example.com/x"`,
		"// doc\n// with A\ntype s struct {\n\ta int\n\tg memapi.Budget\n\th Grant\n\tk other.Grant\n}", // only the contract's Grant is renamed
		`var text = "github.com/memgen/memgen/generated/memapi/x"`,                                      // not a marked literal
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered template lacks %q:\n%s", want, got)
		}
	}
	for _, gone := range []string{"memgen:", "go:build", "without A", "b memapi.Bytes", "package fakes"} {
		if strings.Contains(got, gone) {
			t.Errorf("rendered template still has %q:\n%s", gone, got)
		}
	}

	if _, ok, err := renderTemplate([]byte(text), header, "fk", map[string]bool{"A": true}, literals); ok || err != nil {
		t.Errorf("needs A.M unmet: ok=%v err=%v, want the template left out", ok, err)
	}
	elseOut, ok, err := renderTemplate([]byte(strings.Replace(text, "// memgen:needs A A.M", "// memgen:needs A.M", 1)), header, "fk", map[string]bool{"A.M": true}, literals)
	if err != nil || !ok || !strings.Contains(string(elseOut), "// doc\n// without A\ntype s") {
		t.Errorf("memgen:else not taken: ok=%v err=%v\n%s", ok, err, elseOut)
	}

	for name, bad := range map[string]string{
		"no build tag":   strings.Replace(text, "//go:build memgentmpl\n", "", 1),
		"unknown marker": strings.Replace(text, "// memgen:else", "// memgen:otherwise", 1),
		"nested if":      strings.Replace(text, "// memgen:if B", "// memgen:if A\n// memgen:if B", 1),
		"unclosed if":    strings.Replace(text, "\t// memgen:end\n", "", 1),
		"stray end":      text + "// memgen:end\n",
		"if without arg": strings.Replace(text, "// memgen:if B", "// memgen:if", 1),
		"no package":     strings.Replace(text, "package fakes", "", 1),
	} {
		if _, _, err := renderTemplate([]byte(bad), header, "fk", declared, literals); err == nil {
			t.Errorf("%s: renderTemplate accepted it", name)
		}
	}
}

// TestTemplatesRenderForAnotherModule renders every template for a module
// and package layout unlike memgen's own: no marked literal or template
// package name survives, and every template is rendered into the package it
// is written for.
func TestTemplatesRenderForAnotherModule(t *testing.T) {
	s := loadRepoSpec(t)
	s.Packages.Contract = "api/contract"
	s.Packages.Checked = "api/wrapped"
	s.Packages.Conformance = "api/suite"
	s.Packages.Fakes = "api/fk"
	g := newGen(s, Config{Module: "example.com/other"})
	for tmpl, pkg := range map[string]string{"checkedtmpl": "wrapped", "contracttmpl": "memapi", "conformancetmpl": "suite", "fakestmpl": "fk"} {
		names, err := fs.Glob(templates, tmpl+"/*.go")
		if err != nil || len(names) == 0 {
			t.Fatalf("%s: no templates (%v)", tmpl, err)
		}
		rendered, err := g.renderTemplates(templates, tmpl+"/*.go", pkg)
		if err != nil {
			t.Fatal(err)
		}
		if len(rendered) != len(names) {
			t.Errorf("%s: %d of %d templates rendered for memgen's own spec", tmpl, len(rendered), len(names))
		}
		for _, r := range rendered {
			f, err := parser.ParseFile(token.NewFileSet(), r.name, r.src, parser.ImportsOnly)
			if err != nil {
				t.Fatalf("%s/%s: %v", tmpl, r.name, err)
			}
			if f.Name.Name != pkg {
				t.Errorf("%s/%s: package %s, want %s", tmpl, r.name, f.Name.Name, pkg)
			}
			if strings.Contains(string(r.src), tmplModule) {
				t.Errorf("%s/%s: still names %s", tmpl, r.name, tmplModule)
			}
			for _, im := range f.Imports {
				if p, _ := strconv.Unquote(im.Path.Value); strings.HasPrefix(p, "example.com/") && p != g.Contract() {
					t.Errorf("%s/%s: imports %s, want only the contract %s from the module", tmpl, r.name, p, g.Contract())
				}
			}
		}
	}
}

// TestAuditFiguresMatchTemplate: the generator refuses a method whose verify
// mode reads more figures than audit.before holds in checkedtmpl/audit.go.
func TestAuditFiguresMatchTemplate(t *testing.T) {
	src, err := fs.ReadFile(templates, "checkedtmpl/audit.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "audit.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var n string
	ast.Inspect(f, func(x ast.Node) bool {
		if fld, ok := x.(*ast.Field); ok && len(fld.Names) == 1 && fld.Names[0].Name == "before" {
			if at, ok := fld.Type.(*ast.ArrayType); ok {
				if lit, ok := at.Len.(*ast.BasicLit); ok {
					n = lit.Value
				}
			}
		}
		return true
	})
	if n != strconv.Itoa(auditFigures) {
		t.Errorf("audit.before has %q figures in checkedtmpl/audit.go, auditFigures is %d", n, auditFigures)
	}
}

// loadRepoSpec loads memgen's own spec.
func loadRepoSpec(t *testing.T) *Spec {
	t.Helper()
	data, err := os.ReadFile("../spec/capabilities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load("spec/capabilities.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
