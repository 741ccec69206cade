package memvet_test

import (
	"fmt"
	"go/ast"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/memgen/memgen/memvet"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"
)

// finding marks, in testdata/downstream/bad, the line on which an analyzer
// must report: "finding: NAME [NAME...]".
var finding = regexp.MustCompile(`finding: ([a-z ]+)`)

// run applies every memvet analyzer to one package under testdata and
// returns its findings as "file:line: analyzer", sorted.
func run(t *testing.T, dir string) (got []string, want []string) {
	t.Helper()
	cfg := &packages.Config{Mode: packages.LoadAllSyntax, Dir: ".."}
	pkgs, err := packages.Load(cfg, "./memvet/testdata/downstream/"+dir)
	if err != nil {
		t.Fatal(err)
	}
	if packages.PrintErrors(pkgs) > 0 {
		t.Fatal("the test package does not load")
	}
	g, err := checker.Analyze(memvet.Analyzers(), pkgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for act := range g.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			t.Fatalf("%s: %v", act, act.Err)
		}
		for _, d := range act.Diagnostics {
			p := act.Package.Fset.Position(d.Pos)
			got = append(got, fmt.Sprintf("%s:%d: %s", base(p.Filename), p.Line, act.Analyzer.Name))
		}
	}
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			for _, c := range allComments(f) {
				if m := finding.FindStringSubmatch(c.Text); m != nil {
					pos := p.Fset.Position(c.Pos())
					for _, name := range strings.Fields(m[1]) {
						want = append(want, fmt.Sprintf("%s:%d: %s", base(pos.Filename), pos.Line, name))
					}
				}
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	return got, want
}

func allComments(f *ast.File) []*ast.Comment {
	var cs []*ast.Comment
	for _, g := range f.Comments {
		cs = append(cs, g.List...)
	}
	return cs
}

func base(path string) string { return path[strings.LastIndex(path, "/")+1:] }

// TestDownstreamBad: each analyzer reports exactly the mistakes marked in
// the bad package, on their lines; every analyzer has at least one.
func TestDownstreamBad(t *testing.T) {
	got, want := run(t, "bad")
	if !slices.Equal(got, want) {
		t.Errorf("findings in bad:\n got %q\nwant %q", got, want)
	}
	for _, a := range memvet.Analyzers() {
		if !slices.ContainsFunc(want, func(w string) bool { return strings.HasSuffix(w, ": "+a.Name) }) {
			t.Errorf("the bad package has no mistake for %s", a.Name)
		}
	}
}

// TestDownstreamGood: the corrected package has no finding.
func TestDownstreamGood(t *testing.T) {
	if got, _ := run(t, "good"); len(got) > 0 {
		t.Errorf("findings in good: %q", got)
	}
}
