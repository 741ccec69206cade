package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/clihelp"
)

func memctl(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// create, show, and each outcome of set-capacity; a bad file is a typed
// error with exit code 1; bad arguments are usage errors.
func TestMemctl(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if code, out, e := memctl("create", path, "64M", "8"); code != 0 || !strings.Contains(out, "capacity 64MiB") {
		t.Fatalf("create: %d %q %q", code, out, e)
	}
	code, out, _ := memctl("show", path)
	if code != 0 || !strings.Contains(out, "revision 1, 8 slots") || !strings.Contains(out, "capacity 64MiB  claimed 0") {
		t.Fatalf("show: %d %q", code, out)
	}
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	code, out, _ = memctl("show", path)
	l.Close()
	if code != 0 || !strings.Contains(out, " "+strconv.Itoa(os.Getpid())+" ") {
		t.Fatalf("show with a member: %q", out)
	}
	if code, out, _ := memctl("set-capacity", path, "32M", "1"); code != 0 || !strings.HasPrefix(out, "applied: revision 2, capacity 32MiB") {
		t.Fatalf("set-capacity: %d %q", code, out)
	}
	if code, out, _ := memctl("set-capacity", path, "16M", "1"); code != exitRefused || !strings.HasPrefix(out, "refused: revision 2") || !strings.Contains(out, "stale revision 1") {
		t.Fatalf("stale set-capacity: %d %q", code, out)
	}
	if code, _, _ := memctl("set-capacity", path, "0"); code != 2 {
		t.Fatalf("capacity 0: exit %d", code)
	}
	if code, _, _ := memctl("create", path, "1M"); code != 1 {
		t.Fatalf("create over an existing file: exit %d", code)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("definitely not a ledger, long enough to hold a header of a hundred and twenty-eight bytes......................................................"), 0o600)
	if code, _, e := memctl("show", bad); code != 1 || !strings.Contains(e, "not a ledger file") {
		t.Fatalf("show of a foreign file: %d %q", code, e)
	}
	if code, _, _ := memctl("show"); code != 2 {
		t.Fatalf("no path: exit %d", code)
	}
}

const holdEnv = "MEMCTL_TEST_HOLD" // the helper: hold the ledger's file lock

func TestMain(m *testing.M) {
	if path := os.Getenv(noteEnv); path != "" {
		if err := noteChild(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if path := os.Getenv(holdEnv); path != "" {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("locked")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A process stopped while it holds the ledger's lock: memctl answers at its
// --timeout with exit code 1 and names the process as stopped (it used to
// hang).
func TestTimeoutBehindAStoppedHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if code, _, e := memctl("create", path, "64M", "8"); code != 0 {
		t.Fatalf("create: %d %q", code, e)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+path)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		in.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	for _, args := range [][]string{{"show", path}, {"set-capacity", path, "32M"}, {"create", path + "2", "1M"}} {
		start := time.Now()
		code, _, e := memctl(append([]string{"--timeout", timeout.String()}, args...)...)
		took := time.Since(start)
		t.Logf("%s: exit %d after %v: %s", args[0], code, took, strings.TrimSpace(e))
		if args[0] == "create" {
			// A new file: no lock to wait for.
			if code != 0 {
				t.Fatalf("create beside a stopped holder: exit %d %q", code, e)
			}
			continue
		}
		if code != 1 || !strings.Contains(e, "pid "+strconv.Itoa(cmd.Process.Pid)+" (stopped)") {
			t.Fatalf("%s behind a stopped holder: exit %d after %v: %q", args[0], code, took, e)
		}
	}
	if code, _, _ := memctl("--timeout", "soon", "show", path); code != 2 {
		t.Fatalf("a bad timeout: exit %d, want 2", code)
	}
}

// A refused change exits non-zero (3), and only a refused one: applied and
// deferred exit 0.
func TestRefusedSetCapacityExitsNonZero(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if code, _, e := memctl("create", path, "1GiB", "4"); code != 0 {
		t.Fatalf("create: %d %q", code, e)
	}
	if code, out, _ := memctl("set-capacity", path, "512MiB", "1"); code != 0 || !strings.HasPrefix(out, "applied") {
		t.Fatalf("applied: exit %d %q", code, out)
	}
	code, out, _ := memctl("set-capacity", path, "256MiB", "1")
	if code != clihelp.ExitRefused || !strings.HasPrefix(out, "refused") {
		t.Fatalf("stale revision: exit %d %q, want 3 and refused", code, out)
	}
	// The refusal names the current revision and the command to retry.
	if want := "memctl set-capacity " + path + " 256MiB 2"; !strings.Contains(out, "the ledger is at revision 2") || !strings.Contains(out, want) {
		t.Fatalf("stale revision: %q names neither the current revision nor %q", out, want)
	}
	// Revision 0 is no revision: the error says so and where to read one.
	if code, _, e := memctl("set-capacity", path, "256MiB", "0"); code != 2 || !strings.Contains(e, "revisions start at 1") || !strings.Contains(e, "memctl show "+path) {
		t.Fatalf("revision 0: exit %d %q", code, e)
	}
	if _, out, _ := memctl("show", path); !strings.Contains(out, "capacity 512MiB ") {
		t.Fatalf("a refused change changed the capacity: %q", out)
	}
}

// --help says what PATH is and that a refused change exits non-zero, on
// stdout with exit 0, wherever it is given.
func TestHelpSaysWhatPathIs(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, out, e := memctl(args...)
		if code != 0 || e != "" {
			t.Fatalf("%q: exit %d, stderr %q", args, code, e)
		}
		for _, want := range []string{"PATH is the ledger file", "/dev/shm", "3 set-capacity refused the change", "1GiB", clihelp.ExitCodes} {
			if !strings.Contains(out, want) {
				t.Errorf("%q: help lacks %q:\n%s", args, want, out)
			}
		}
	}
}

// memctl reads sizes with the parser memdemo uses: units in every
// spelling, plain bytes; zero and nonsense are usage errors.
func TestSizes(t *testing.T) {
	for in, want := range map[string]uint64{"1GiB": 1 << 30, "512MiB": 512 << 20, "64M": 64 << 20, "4096": 4096, "1.5GiB": 3 << 29, "2g": 2 << 30} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"0", "0MiB", "1XiB", "-1", "8PiB", "5000TiB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) succeeded", in)
		}
	}
	path := filepath.Join(t.TempDir(), "ledger")
	if code, out, e := memctl("create", path, "1GiB"); code != 0 || !strings.Contains(out, "capacity 1GiB") {
		t.Fatalf("create 1GiB: %d %q %q", code, out, e)
	}
}

// Each verb has its own --help, with an example; every help fits 80
// columns; sizes are in binary units, or plain bytes with --bytes.
func TestVerbHelpAndUnits(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"show", "--help"}, {"set-capacity", "--help"}, {"create", "--help"}, {"show", "/dev/shm/x", "-h"}} {
		code, out, e := memctl(args...)
		if code != 0 || e != "" {
			t.Fatalf("%q: exit %d, stderr %q", args, code, e)
		}
		for _, line := range strings.Split(out, "\n") {
			if len(line) > 80 {
				t.Errorf("%q: a line of %d columns: %q", args, len(line), line)
			}
		}
		if len(args) > 1 && !strings.Contains(out, "example:\n  memctl "+args[0]+" ") {
			t.Errorf("%q: no example:\n%s", args, out)
		}
	}
	path := filepath.Join(t.TempDir(), "ledger")
	if code, _, e := memctl("create", path, "1536MiB"); code != 0 {
		t.Fatalf("create: %q", e)
	}
	if _, out, _ := memctl("show", path); !strings.Contains(out, "capacity 1.5GiB ") {
		t.Errorf("show: %q, want capacity 1.5GiB", out)
	}
	if _, out, _ := memctl("--bytes", "show", path); !strings.Contains(out, "capacity 1610612736 ") {
		t.Errorf("show --bytes: %q, want capacity 1610612736", out)
	}
	for n, want := range map[uint64]string{0: "0", 512: "512B", 1536: "1.5KiB", 64 << 20: "64MiB", 1<<30 + 1<<20*10: "1.01GiB"} {
		if got := human(n); got != want {
			t.Errorf("human(%d) = %q, want %q", n, got, want)
		}
		if n != 0 && want != "1.01GiB" { // a rounded figure is display only: --bytes is exact
			if back, err := parseBytes(human(n)); err != nil || back != n {
				t.Errorf("parseBytes(%q) = %d, %v; want %d", human(n), back, err, n)
			}
		}
	}
}
