package pathtable

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A profile's blocks map to the functions that hold them: a method by its
// receiver, a function literal as its own function, blocks that did not
// run, test files and skipped directories not at all.
func TestMeasure(t *testing.T) {
	root := t.TempDir()
	src, err := os.ReadFile("testdata/m/p/f.go.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"p/f.go", "skip/s.go"} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	profile := `mode: atomic
example.com/m/p/f.go:3.16,3.26 1 4
example.com/m/p/f.go:7.26,8.19 1 1
example.com/m/p/f.go:8.19,10.3 1 2
example.com/m/p/f.go:13.11,13.12 0 0
example.com/m/p/f_test.go:1.1,2.2 1 9
example.com/m/skip/s.go:3.16,3.26 1 1
`
	blocks, err := ParseProfile(strings.NewReader(profile))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 6 || blocks[1] != (Block{File: "example.com/m/p/f.go", Start: 7, StartCol: 26, End: 8, Count: 1}) {
		t.Fatalf("parsed %+v", blocks)
	}
	p, err := Measure(blocks, "example.com/m", root, "skip")
	if err != nil {
		t.Fatal(err)
	}
	want := Path{Functions: []string{"p.(*T).M", "p.(*T).M.func1", "p.A"}, Files: []string{"p/f.go"}}
	if !reflect.DeepEqual(p.Functions, want.Functions) || !reflect.DeepEqual(p.Files, want.Files) {
		t.Fatalf("measured %+v, want %+v", p, want)
	}
	// What all of several measures entered: a function one of them
	// lacks is not counted, nor is its file when it was alone there.
	q, err := Measure(blocks[:2], "example.com/m", root, "skip")
	if err != nil {
		t.Fatal(err)
	}
	if c := Common(p, q); !reflect.DeepEqual(c.Functions, []string{"p.(*T).M", "p.A"}) || !reflect.DeepEqual(c.Files, []string{"p/f.go"}) {
		t.Fatalf("common %+v", c)
	}
	if _, err := Measure([]Block{{File: "other.org/x/y.go", Count: 1}}, "example.com/m", root); err == nil {
		t.Fatal("a file outside the module was measured")
	}
	if _, err := ParseProfile(strings.NewReader("example.com/m/p/f.go:3.16 1\n")); err == nil {
		t.Fatal("a malformed line was read")
	}
}

// Replace swaps the text between its two marker lines, and refuses a
// document without them.
func TestReplace(t *testing.T) {
	doc := "intro\n<!-- b -->\nold\n<!-- e -->\nrest\n"
	got, err := Replace(doc, "<!-- b -->", "<!-- e -->", "new\n")
	if err != nil || got != "intro\n<!-- b -->\nnew\n<!-- e -->\nrest\n" {
		t.Fatalf("%q, %v", got, err)
	}
	if _, err := Replace("no markers", "<!-- b -->", "<!-- e -->", "x"); err == nil {
		t.Fatal("replaced without markers")
	}
}

// The table counts memgen's layers and the mechanism's own code apart.
func TestTableSplitsTheMechanism(t *testing.T) {
	p := Path{
		Functions: []string{"mechanisms/cpu.(*M).Allocate", "pmm.(*B).Allocate", "pmm.begin"},
		Files:     []string{"mechanisms/cpu/a.go", "pmm/b.go"},
		file:      map[string]string{"mechanisms/cpu.(*M).Allocate": "mechanisms/cpu/a.go", "pmm.(*B).Allocate": "pmm/b.go", "pmm.begin": "pmm/b.go"},
	}
	got := Table([]string{"x", "y"}, map[string]Path{"x": p}, map[string]string{"x": "≤ 2"})
	want := "| path | functions entered | files | the mechanism's own: functions, files | goal |\n| --- | --- | --- | --- | --- |\n" +
		"| x | 2 | 1 | 1, 1 | ≤ 2 |\n| y | 0 | 0 | 0, 0 | — |\n"
	if got != want {
		t.Fatalf("table\n%s\nwant\n%s", got, want)
	}
}
