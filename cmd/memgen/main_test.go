package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/memgen/memgen/gen"
	"github.com/memgen/memgen/internal/clihelp"
)

// memgen runs the command in-process and returns its exit code and output.
func memgen(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

// newModule makes a scratch copy of the module's inputs (go.mod, go.sum and a
// spec) and returns its root. spec is a path relative to this package; the
// real spec when empty.
func newModule(t *testing.T, spec string) string {
	t.Helper()
	if spec == "" {
		spec = "../../spec/capabilities.yaml"
	}
	root := t.TempDir()
	for dst, src := range map[string]string{
		"go.mod":                 "../../go.mod",
		"go.sum":                 "../../go.sum",
		"spec/capabilities.yaml": spec,
	} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, root, dst, string(data))
	}
	return root
}

func writeFile(t *testing.T, root, rel, data string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, root, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// snapshot returns every file under root with its content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		out[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, before, after map[string]string) {
	t.Helper()
	var diffs []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			diffs = append(diffs, "removed "+k)
		} else if v != w {
			diffs = append(diffs, "changed "+k)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			diffs = append(diffs, "added "+k)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Errorf("tree changed:\n\t%s", strings.Join(diffs, "\n\t"))
	}
}

func wantCode(t *testing.T, got, want int, stdout, stderr string) {
	t.Helper()
	if got != want {
		t.Fatalf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", got, want, stdout, stderr)
	}
}

func wantContains(t *testing.T, out string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}

// TestExitCodesDocumented: memgen's help gives the exit codes memctl and
// memdemo give, and its constants are theirs.
func TestExitCodesDocumented(t *testing.T) {
	code, stdout, _ := memgen(t, "--help")
	wantCode(t, code, clihelp.ExitOK, stdout, "")
	wantContains(t, stdout, clihelp.ExitCodes)
	if exitOK != clihelp.ExitOK || exitSpec != clihelp.ExitFailed || exitUsage != clihelp.ExitUsage || exitRefused != clihelp.ExitRefused {
		t.Error("memgen's exit codes differ from the shared ones")
	}
}

func TestUsageExitCodes(t *testing.T) {
	root := newModule(t, "")
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // expected in stdout (code 0) or stderr (otherwise)
	}{
		{"no command", nil, exitUsage, "usage: memgen <command>"},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"help", []string{"--help"}, exitOK, "usage: memgen <command>"},
		{"help word", []string{"help"}, exitOK, "commands:"},
		{"help with a command", []string{"help", "check"}, exitOK, "usage: memgen check [flags]"},
		{"help with an unknown command", []string{"help", "frobnicate"}, exitUsage, `want one command's name, got ["frobnicate"]`},
		{"version", []string{"version"}, exitOK, "memgen github.com/memgen/memgen "},
		{"version with arguments", []string{"version", "now"}, exitUsage, "unexpected arguments"},
		{"version --help", []string{"version", "--help"}, exitOK, "usage: memgen version"},
		{"version -h", []string{"version", "-h"}, exitOK, "usage: memgen version"},
		{"version with a bad flag", []string{"version", "--bogus"}, exitUsage, "flag provided but not defined: -bogus"},
		{"help version", []string{"help", "version"}, exitOK, "usage: memgen version"},
		{"help help", []string{"help", "help"}, exitOK, "usage: memgen <command>"},
		{"help --help", []string{"help", "--help"}, exitOK, "usage: memgen <command>"},
		{"bad flag", []string{"check", "--bogus"}, exitUsage, "flag provided but not defined: -bogus"},
		{"extra argument", []string{"generate", "-root", root, "extra"}, exitUsage, "unexpected arguments"},
		{"missing root", []string{"check", "-root", filepath.Join(root, "nowhere")}, exitUsage, "go.mod"},
		{"missing spec", []string{"check", "-root", root, "-spec", "spec/none.yaml"}, exitUsage, "none.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := memgen(t, tc.args...)
			wantCode(t, code, tc.code, stdout, stderr)
			if tc.code == exitOK {
				wantContains(t, stdout, tc.out)
			} else {
				wantContains(t, stderr, tc.out)
			}
		})
	}
}

// TestHelpOnEveryVerb: --help and -h print the verb's usage and flags on
// stdout and exit 0, for every verb there is.
func TestHelpOnEveryVerb(t *testing.T) {
	var verbs []string
	for v := range commands {
		verbs = append(verbs, v)
	}
	sort.Strings(verbs)
	for _, want := range []string{"check", "doc", "generate"} {
		if _, ok := commands[want]; !ok {
			t.Errorf("verb %s is missing", want)
		}
	}
	for _, v := range verbs {
		for _, h := range []string{"--help", "-h"} {
			code, stdout, stderr := memgen(t, v, h)
			wantCode(t, code, exitOK, stdout, stderr)
			wantContains(t, stdout, "usage: memgen "+v, "-root", "-spec")
			if stderr != "" {
				t.Errorf("%s %s wrote to stderr: %s", v, h, stderr)
			}
		}
		// The top-level usage names every verb.
		_, stdout, _ := memgen(t, "--help")
		wantContains(t, stdout, "  "+v+" ")
	}
}

// TestEveryListedVerbTakesHelp: every verb the top-level usage lists
// (version and help included) takes --help and -h, and help VERB prints
// the same, on stdout with exit 0.
func TestEveryListedVerbTakesHelp(t *testing.T) {
	_, top, _ := memgen(t, "--help")
	_, list, ok := strings.Cut(top, "commands:\n")
	if !ok {
		t.Fatalf("no commands: section in the usage:\n%s", top)
	}
	var verbs []string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") && len(f) > 0 {
			verbs = append(verbs, f[0])
		}
	}
	for _, want := range []string{"generate", "check", "doc", "version", "help"} {
		if !slices.Contains(verbs, want) {
			t.Fatalf("verbs listed %q lack %s", verbs, want)
		}
	}
	for _, v := range verbs {
		var outs []string
		for _, args := range [][]string{{v, "--help"}, {v, "-h"}, {"help", v}} {
			code, stdout, stderr := memgen(t, args...)
			wantCode(t, code, exitOK, stdout, stderr)
			if stderr != "" || !strings.Contains(stdout, "usage: memgen ") {
				t.Errorf("memgen %q: stdout %q, stderr %q", args, stdout, stderr)
			}
			outs = append(outs, stdout)
		}
		if outs[0] != outs[2] {
			t.Errorf("memgen help %s differs from memgen %s --help:\n%s\n---\n%s", v, v, outs[2], outs[0])
		}
	}
}

func TestSpecErrorExitsOne(t *testing.T) {
	root := newModule(t, "../../gen/testdata/err_several/spec.yaml")
	// Every problem the loader's golden test lists, each with its position.
	want, err := os.ReadFile("../../gen/testdata/err_several/want_errors.txt")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(want)), "\n")
	for _, verb := range []string{"generate", "check", "doc"} {
		code, stdout, stderr := memgen(t, verb, "-root", root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, lines...)
		if n := strings.Count(stderr, "spec/capabilities.yaml:"); n != len(lines) {
			t.Errorf("%s: %d positioned errors, want %d:\n%s", verb, n, len(lines), stderr)
		}
	}
}

// TestCheckDrift: check passes right after generate and fails, naming the
// file, after a hand edit, after a spec change without regeneration, and
// when a file memgen once wrote is no longer produced.
func TestCheckDrift(t *testing.T) {
	root := newModule(t, "")
	code, stdout, stderr := memgen(t, "generate", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	code, stdout, stderr = memgen(t, "check", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	wantContains(t, stdout, "memgen check: ok")

	t.Run("hand edit", func(t *testing.T) {
		rel := "generated/memapi/errors.go"
		orig := readFile(t, root, rel)
		writeFile(t, root, rel, orig+"\n// a hand edit\n")
		defer writeFile(t, root, rel, orig)
		code, stdout, stderr := memgen(t, "check", "-root", root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, rel+": differs from the spec",
			"--- "+rel+" (in the tree)\n+++ "+rel+" (from the spec)\n@@ ", "\n-// a hand edit\n")
		if strings.Count(stderr, "differs") != 1 {
			t.Errorf("only %s was edited:\n%s", rel, stderr)
		}
	})
	t.Run("hand edit of the doc", func(t *testing.T) {
		orig := readFile(t, root, gen.DocFile)
		writeFile(t, root, gen.DocFile, strings.Replace(orig, "# Capabilities", "# Capabilities (edited)", 1))
		defer writeFile(t, root, gen.DocFile, orig)
		code, stdout, stderr := memgen(t, "check", "-root", root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, gen.DocFile+": differs from the spec")
	})
	t.Run("missing file", func(t *testing.T) {
		rel := "generated/memapi/ranges.go"
		orig := readFile(t, root, rel)
		if err := os.Remove(filepath.Join(root, rel)); err != nil {
			t.Fatal(err)
		}
		defer writeFile(t, root, rel, orig)
		code, stdout, stderr := memgen(t, "check", "-root", root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, rel+": missing")
	})
	t.Run("spec changed", func(t *testing.T) {
		orig := readFile(t, root, "spec/capabilities.yaml")
		writeFile(t, root, "spec/capabilities.yaml", strings.Replace(orig, "doc: A count of bytes.", "doc: A number of bytes.", 1))
		defer writeFile(t, root, "spec/capabilities.yaml", orig)
		code, stdout, stderr := memgen(t, "check", "-root", root)
		wantCode(t, code, exitSpec, stdout, stderr)
		// The digest and the doc comment of Bytes moved.
		wantContains(t, stderr, "generated/memapi/types.go: differs", "generated/memapi/doc.go: differs")
		// One diff, of the first file that differs.
		if n := strings.Count(stderr, "\n+++ "); n != 1 {
			t.Errorf("%d diffs, want the first file's only:\n%s", n, stderr)
		}
	})
	t.Run("stale file", func(t *testing.T) {
		rel := "generated/memapi/retired.go"
		writeFile(t, root, rel, gen.HeaderPrefix+" from spec/capabilities.yaml (emitter contract). DO NOT EDIT.\n\npackage memapi\n")
		defer os.Remove(filepath.Join(root, rel))
		code, stdout, stderr := memgen(t, "check", "-root", root)
		wantCode(t, code, exitSpec, stdout, stderr)
		wantContains(t, stderr, rel+": stale")
		// generate removes it, and only it.
		before := snapshot(t, root)
		code, stdout, stderr = memgen(t, "generate", "-v", "-root", root)
		wantCode(t, code, exitOK, stdout, stderr)
		if strings.TrimSpace(stdout) != "removed "+rel {
			t.Errorf("generate -v said %q, want only the removal of %s", stdout, rel)
		}
		delete(before, rel)
		sameTree(t, before, snapshot(t, root))
	})
	t.Run("hand-written file with a generated name is not stale", func(t *testing.T) {
		rel := "generated/memapi/handwritten.go"
		writeFile(t, root, rel, "package memapi\n")
		defer os.Remove(filepath.Join(root, rel))
		code, stdout, stderr := memgen(t, "check", "-root", root)
		wantCode(t, code, exitOK, stdout, stderr)
	})
	code, stdout, stderr = memgen(t, "check", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
}

// TestGenerateTwiceChangesNothing is `go generate ./...` run twice: the
// second run writes no file and changes no byte.
func TestGenerateTwiceChangesNothing(t *testing.T) {
	root := newModule(t, "")
	code, stdout, stderr := memgen(t, "generate", "-v", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	if !strings.Contains(stdout, "wrote "+gen.DocFile) {
		t.Errorf("first run did not write %s:\n%s", gen.DocFile, stdout)
	}
	before := snapshot(t, root)
	code, stdout, stderr = memgen(t, "generate", "-v", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	if stdout != "" {
		t.Errorf("second run wrote files:\n%s", stdout)
	}
	sameTree(t, before, snapshot(t, root))
}

// TestGenerateRefusesForeignFile: a file without memgen's header where a
// generated file belongs is never overwritten, and then nothing is written.
func TestGenerateRefusesForeignFile(t *testing.T) {
	root := newModule(t, "")
	rel := "generated/memapi/types.go"
	writeFile(t, root, rel, "package memapi\n\n// written by a person\n")
	before := snapshot(t, root)
	code, stdout, stderr := memgen(t, "generate", "-root", root)
	wantCode(t, code, exitSpec, stdout, stderr)
	wantContains(t, stderr, rel, "not generated by memgen", "refusing")
	sameTree(t, before, snapshot(t, root))

	// doc refuses the same way for its one file.
	writeFile(t, root, gen.DocFile, "# my own notes\n")
	code, stdout, stderr = memgen(t, "doc", "-root", root)
	wantCode(t, code, exitSpec, stdout, stderr)
	wantContains(t, stderr, "refusing")
	if got := readFile(t, root, gen.DocFile); got != "# my own notes\n" {
		t.Errorf("doc overwrote a hand-written file: %q", got)
	}
}

// TestFailedGenerateLeavesFilesUntouched: a spec error stops generate before
// it writes anything.
func TestFailedGenerateLeavesFilesUntouched(t *testing.T) {
	root := newModule(t, "")
	code, stdout, stderr := memgen(t, "generate", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	spec := readFile(t, root, "spec/capabilities.yaml")
	writeFile(t, root, "spec/capabilities.yaml", strings.Replace(spec, "  Bytes:\n    kind: scalar", "  Bytes:\n    kind: scalr", 1))
	before := snapshot(t, root)
	code, stdout, stderr = memgen(t, "generate", "-root", root)
	wantCode(t, code, exitSpec, stdout, stderr)
	wantContains(t, stderr, `unknown kind "scalr"`)
	sameTree(t, before, snapshot(t, root))
}

// TestDoc: memgen doc writes exactly the file generate writes, to stdout
// with -o -.
func TestDoc(t *testing.T) {
	root := newModule(t, "")
	code, stdout, stderr := memgen(t, "generate", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	want := readFile(t, root, gen.DocFile)
	for _, section := range []string{gen.MarkdownHeaderPrefix, "## Capability matrix", "## Methods and their accounting", "## Invariants", "```mermaid", "| `charge-before-commit` |"} {
		wantContains(t, want, section)
	}
	if err := os.Remove(filepath.Join(root, gen.DocFile)); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = memgen(t, "doc", "-v", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	wantContains(t, stdout, "wrote "+gen.DocFile)
	if got := readFile(t, root, gen.DocFile); got != want {
		t.Error("memgen doc and memgen generate disagree on " + gen.DocFile)
	}
	code, stdout, stderr = memgen(t, "doc", "-o", "-", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
	if stdout != want {
		t.Error("memgen doc -o - printed something else than the file")
	}
	code, stdout, stderr = memgen(t, "check", "-root", root)
	wantCode(t, code, exitOK, stdout, stderr)
}

// TestHeaderNamesTheSpecGiven: the generated files' headers name the spec
// by the path memgen was given, relative to the module root.
func TestHeaderNamesTheSpecGiven(t *testing.T) {
	root := newModule(t, "")
	writeFile(t, root, "spec/alt/memory.yaml", readFile(t, root, "spec/capabilities.yaml"))
	code, stdout, stderr := memgen(t, "doc", "-o", "-", "-root", root, "-spec", "spec/alt/memory.yaml")
	wantCode(t, code, exitOK, stdout, stderr)
	first, _, _ := strings.Cut(stdout, "\n")
	if want := gen.MarkdownHeaderPrefix + " from spec/alt/memory.yaml (emitter doc). DO NOT EDIT. -->"; first != want {
		t.Errorf("memgen doc -spec spec/alt/memory.yaml: header %q, want %q", first, want)
	}
	code, stdout, stderr = memgen(t, "generate", "-root", root, "-spec", "spec/alt/memory.yaml")
	wantCode(t, code, exitOK, stdout, stderr)
	first, _, _ = strings.Cut(readFile(t, root, "generated/memapi/types.go"), "\n")
	if want := gen.HeaderPrefix + " from spec/alt/memory.yaml (emitter contract). DO NOT EDIT."; first != want {
		t.Errorf("memgen generate -spec spec/alt/memory.yaml: types.go's header %q, want %q", first, want)
	}
}

// Every help memgen prints fits 80 columns and ends with an example.
func TestHelpFitsEightyColumns(t *testing.T) {
	names := []string{"version"}
	for n := range commands {
		names = append(names, n)
	}
	check := func(what, out string) {
		t.Helper()
		for _, line := range strings.Split(out, "\n") {
			if len(line) > 80 {
				t.Errorf("%s: a line of %d columns: %q", what, len(line), line)
			}
		}
	}
	var out, errb strings.Builder
	if code := run([]string{"--help"}, &out, &errb); code != exitOK {
		t.Fatalf("--help: exit %d", code)
	}
	check("memgen --help", out.String())
	for _, n := range names {
		var out, errb strings.Builder
		if code := run([]string{n, "--help"}, &out, &errb); code != exitOK {
			t.Fatalf("%s --help: exit %d, %s", n, code, errb.String())
		}
		check(n+" --help", out.String())
		if !strings.Contains(out.String(), "example:\n  memgen "+n) {
			t.Errorf("%s --help has no example:\n%s", n, out.String())
		}
	}
}
