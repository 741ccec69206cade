package plugin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/memgen/memgen/generated/memapi"
)

func TestMain(m *testing.M) {
	code := m.Run()
	_ = os.RemoveAll(buildDir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var bg = context.Background()

// grant is the smallest memapi.Grant: the bare mechanism only checks that a
// consuming call has one (the checked wrapper draws from it).
type grant struct{}

func (grant) Authority() memapi.AuthorityID { return "host" }
func (grant) Draw(memapi.Bytes) error       { return nil }
func (grant) Undraw(memapi.Bytes) error     { return nil }
func (grant) Refund(memapi.Bytes) error     { return nil }

var g grant

// includeDir is the directory of the generated header, from this package.
const includeDir = "../../include"

// cc returns the C compiler, or skips the test when there is none.
func cc(t testing.TB) string {
	t.Helper()
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	t.Skip("no C compiler (cc, gcc or clang) on PATH: the plugin C ABI tests build C code and are skipped")
	return ""
}

// cFlags are the flags every C file of these tests is built with: optimized,
// as a plugin ships.
var cFlags = []string{"-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I" + includeDir}

var (
	buildDir  = must(os.MkdirTemp("", "memgen-plugin-test-"))
	buildMu   sync.Mutex
	built     = map[string]string{}
	buildErrs = map[string]error{}
)

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// refhost builds testdata/refhost.c with the given -D macros into a shared
// library (once per set of macros) and returns its path.
func refhost(t testing.TB, defines ...string) string {
	t.Helper()
	return build(t, "refhost", defines...)
}

// build builds testdata/<name>.c with the given -D macros into a shared
// library (once per file and set of macros) and returns its path.
func build(t testing.TB, name string, defines ...string) string {
	t.Helper()
	compiler := cc(t)
	key := name + ":" + strings.Join(defines, " ")
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[key]; ok {
		return p
	}
	if err, ok := buildErrs[key]; ok {
		t.Fatal(err)
	}
	lib := name
	for _, d := range defines {
		lib += "_" + strings.Map(func(r rune) rune {
			if r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return '_'
		}, strings.TrimPrefix(strings.TrimPrefix(d, "REFHOST_"), "BROKEN_"))
	}
	out := filepath.Join(buildDir, lib+".so")
	args := append(append([]string{}, cFlags...), "-fPIC", "-shared", "-pthread", "-o", out, "testdata/"+name+".c")
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	if b, err := exec.Command(compiler, args...).CombinedOutput(); err != nil {
		buildErrs[key] = err
		t.Fatalf("building testdata/%s.c with %v: %v\n%s", name, defines, err, b)
	}
	built[key] = out
	return out
}

// newSubject opens a fresh instance of the plugin at path and its context,
// closing both when the test ends (and failing it when they do not close).
func newSubject(t testing.TB, path string) (*Mechanism, *Context) {
	t.Helper()
	return newSubjectOpts(t, path, Options{})
}

// newSubjectOpts is newSubject with options.
func newSubjectOpts(t testing.TB, path string, o Options) (*Mechanism, *Context) {
	t.Helper()
	m, err := New(path, o)
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("context close: %v", err)
		}
		if err := m.Close(); err != nil {
			t.Errorf("mechanism close: %v", err)
		}
	})
	return m, c
}
