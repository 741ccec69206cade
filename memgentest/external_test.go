package memgentest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The downstream module: a store of named buffers over a binding, with a
// Drop that forgets to close what it drops when leaky is set, and its
// tests, each with two lines of setup.
const (
	storeGo = `package store

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// Store keeps named buffers allocated through a binding.
type Store struct {
	b     *pmm.Binding
	bufs  map[string]*pmm.Buffer
	leaky bool // the planted bug: Drop forgets the buffer without closing it
}

func New(b *pmm.Binding, leaky bool) *Store {
	return &Store{b: b, bufs: map[string]*pmm.Buffer{}, leaky: leaky}
}

func (s *Store) Put(ctx context.Context, key string, n memapi.Bytes) error {
	buf, err := s.b.Allocate(ctx, n)
	if err != nil {
		return err
	}
	s.bufs[key] = buf
	return nil
}

func (s *Store) Drop(key string) error {
	buf := s.bufs[key]
	delete(s.bufs, key)
	if s.leaky {
		return nil
	}
	return buf.Close()
}
`
	storeTestGo = `package store

import (
	"context"
	"testing"

	"github.com/memgen/memgen/memgentest"
)

func testPutDrop(t *testing.T, leaky bool) {
	h := memgentest.New(t, memgentest.Options{})
	s := New(h.Bind("sessions", "kv"), leaky)

	if err := s.Put(context.Background(), "a", 10000); err != nil {
		t.Fatal(err)
	}
	if err := s.Drop("a"); err != nil {
		t.Fatal(err)
	}
}

func TestPutDrop(t *testing.T)      { testPutDrop(t, false) }
func TestPutDropLeaky(t *testing.T) { testPutDrop(t, true) }
`
)

// setupLines counts the lines of testPutDrop that set up memgen: from its
// first line to the line that makes the store, both included.
func setupLines(src string) int {
	body := src[strings.Index(src, "func testPutDrop"):]
	lines := strings.Split(body, "\n")
	for i, l := range lines {
		if strings.Contains(l, "s := New(") {
			return i // lines[1..i]
		}
	}
	return -1
}

// A module outside the repository, built in a temporary directory with a
// replace pointing at this checkout, tests its own code against
// memgentest: the correct code passes, and the planted leak fails its test
// with the leaked handle's name, without hanging.
func TestDownstreamModule(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	if n := setupLines(storeTestGo); n < 1 || n > 5 {
		t.Fatalf("the downstream test's setup is %d lines, want at most 5", n)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/store\n\ngo 1.26.0\n\nrequire github.com/memgen/memgen v0.1.0\n\nreplace github.com/memgen/memgen => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"go.mod": gomod, "go.sum": string(sum), "store.go": storeGo, "store_test.go": storeTestGo} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gotest := func(run string) (string, error) {
		// Bounded: a hanging cleanup would show as this timeout, not as a
		// hung suite. The build from a cold cache is most of it.
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, gobin, "test", "-count=1", "-v", "-run", "^("+run+")$", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local")
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("go test -run %s in the downstream module did not finish in 8 minutes:\n%s", run, out)
		}
		return string(out), err
	}

	// One go test for both (one build): the correct code's test passes,
	// the leaky code's fails, and so go test exits 1.
	out, err := gotest("TestPutDrop|TestPutDropLeaky")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("go test: %v, want exit status 1 (the leaky code's test failing)\n%s", err, out)
	}
	if !strings.Contains(out, "--- PASS: TestPutDrop (") {
		t.Fatalf("the correct code did not pass:\n%s", out)
	}
	if !regexp.MustCompile(`memgentest: leaked sessions/kv buffer 0x[0-9a-f]+: still open at the end of the test`).MatchString(out) {
		t.Fatalf("the failure does not name the leaked buffer:\n%s", out)
	}
	t.Logf("the downstream module's go test:\n%s", out)
	m := regexp.MustCompile(`--- FAIL: TestPutDropLeaky \(([0-9.]+)s\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no FAIL line for TestPutDropLeaky:\n%s", out)
	}
	// Waiting for the leaked buffer would have taken the harness's whole
	// drain bound (Options.Drain, 10 s): the report comes well before.
	if secs, _ := strconv.ParseFloat(m[1], 64); secs >= 9 {
		t.Fatalf("the leaky test took %ss: its cleanup waited for the bound instead of reporting", m[1])
	}
}
