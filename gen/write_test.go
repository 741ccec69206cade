package gen

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestWriteRemovesStaleOnlyWhereItWrites: Write removes a stale file that
// carries memgen's header only inside a generated package's directory, or
// when it is a mechanism's glue or the capability reference; the same header
// anywhere else (a copy under examples/, a sub-package of an output
// directory, another page under docs/) is left alone.
func TestWriteRemovesStaleOnlyWhereItWrites(t *testing.T) {
	root := t.TempDir()
	header := goHeader(specName, "contract", "")
	gofile := header + "\n\npackage x\n"
	files := map[string][]byte{
		"generated/memapi/types.go":        []byte(header + "\n\npackage memapi\n"),
		"mechanisms/cpu/" + GlueFile:       []byte(header + "\n\npackage cpu\n"),
		DocFile:                            []byte(markdownHeader(specName, "doc") + "\n# Capabilities\n"),
		"generated/conformance/suite.go":   []byte(header + "\n\npackage conformance\n"),
		"generated/conformance/example.go": []byte(header + "\n\npackage conformance\n"),
	}
	write := func(rel, data string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(data), 0o644))
	}
	stale := []string{
		"generated/memapi/retired.go",        // in an output directory
		"mechanisms/gone/" + GlueFile,        // the glue of a mechanism no longer declared
		"generated/conformance/old_suite.go", // in an output directory
	}
	kept := []string{
		"examples/copied/types.go",           // a copy outside the output directories
		"generated/memapi/sub/nested.go",     // a sub-package is not the output package
		"docs/other.md",                      // docs/ holds hand-written pages too
		"mechanisms/cpu/zz_generated_old.go", // beside the glue, but not the glue
		"generated/memapi/handwritten.go",    // no header: never memgen's
	}
	for _, rel := range stale {
		write(rel, gofile)
	}
	for _, rel := range kept[:4] {
		if filepath.Ext(rel) == ".md" {
			write(rel, markdownHeader(specName, "doc")+"\n")
		} else {
			write(rel, gofile)
		}
	}
	write(kept[4], "package memapi\n")

	_, gotStale, err := Diff(root, files)
	must(t, err)
	wantStale := []string{"generated/conformance/old_suite.go", "generated/memapi/retired.go", "mechanisms/gone/" + GlueFile}
	if !reflect.DeepEqual(gotStale, wantStale) {
		t.Errorf("Diff: stale %v, want %v", gotStale, wantStale)
	}
	_, removed, err := Write(root, files)
	must(t, err)
	if !reflect.DeepEqual(removed, wantStale) {
		t.Errorf("Write removed %v, want %v", removed, wantStale)
	}
	for _, rel := range kept {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel))); err != nil {
			t.Errorf("%s: removed or unreadable (%v), want it kept", rel, err)
		}
	}
	for rel, data := range files {
		got, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil || string(got) != string(data) {
			t.Errorf("%s: not written (%v)", rel, err)
		}
	}
}
