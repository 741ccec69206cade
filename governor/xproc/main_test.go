package xproc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/internal/watchdog"
	"go.uber.org/goleak"
)

// The multi-process tests re-execute the test binary with childEnv naming
// a scenario; TestMain runs it and exits. The child's other settings come
// through the environment too.
const (
	childEnv       = "MEMGEN_XPROC_CHILD"
	pathEnv        = "MEMGEN_XPROC_LEDGER"
	seedEnv        = "MEMGEN_XPROC_SEED"
	poolEnv        = "MEMGEN_XPROC_POOL"        // the simulated GPU's shared memory (cuda scenario)
	noLedgerEnv    = "MEMGEN_XPROC_NOLEDGER"    // the cuda scenario without the ledger: kvcached #467's way
	trialsEnv      = "MEMGEN_XPROC_TRIALS"      // kill -9 trials (TestKillNine)
	defaultPoolEnv = "MEMGEN_XPROC_DEFAULTPOOL" // the cuda scenario with the mechanism's default pool and spares
)

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		os.Exit(runChild(name))
	}
	goleak.VerifyTestMain(m)
}

func runChild(name string) int {
	var err error
	switch name {
	case "reserve":
		err = childReserve()
	case "pmm":
		err = childPmm()
	case "churn":
		err = childChurn()
	case "cuda":
		err = childCUDA()
	case "cache":
		err = childCache()
	case "holdlock":
		err = childHoldLock()
	case "want":
		err = childWant()
	case "idle":
		err = childIdle()
	case "cudachurn":
		err = childCUDAChurn()
	case "owner":
		err = childOwner()
	case "tier":
		err = childTier()
	default:
		err = fmt.Errorf("unknown child scenario %q", name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// proc is a running child: its stdin, and its stdout line by line.
type proc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	pid   int
}

// spawn starts the test binary as child scenario name with env added.
func spawn(t testing.TB, name string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+name), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, in: in, lines: make(chan string, 16), pid: cmd.Process.Pid}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	return p
}

// expect reads the child's next line, which must start with prefix, and
// returns its fields after the prefix. A child that has not written it
// after watchdog.Bound is stuck, not slow: the test fails, saying
// "watchdog", and the child prints every goroutine's stack (SIGQUIT).
func (p *proc) expect(t testing.TB, prefix string) []string {
	t.Helper()
	select {
	case s, ok := <-p.lines:
		if !ok {
			t.Fatalf("child %d ended before %q", p.pid, prefix)
		}
		if !strings.HasPrefix(s, prefix) {
			t.Fatalf("child %d: %q, want %q", p.pid, s, prefix)
		}
		return strings.Fields(strings.TrimPrefix(s, prefix))
	case <-time.After(watchdog.Bound):
		p.stacks()
		t.Fatalf("watchdog: child %d: no %q within %v; its goroutines' stacks are above (SIGQUIT)", p.pid, prefix, watchdog.Bound)
	}
	return nil
}

// stacks makes the child print every goroutine's stack on its stderr (the
// test's) and waits for it to exit.
func (p *proc) stacks() {
	if p.cmd.Process.Signal(syscall.SIGQUIT) == nil {
		_, _ = p.cmd.Process.Wait()
	}
}

// finish closes the child's stdin (its signal to clean up and leave) and
// waits for it to exit successfully.
func (p *proc) finish(t testing.TB) {
	t.Helper()
	p.in.Close()
	p.expect(t, "done")
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("child %d: %v", p.pid, err)
	}
}

func atoi(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// contextBG is the children's context.
var contextBG = context.Background()

// stdin is a child's input from the parent: a go-ahead line, then EOF.
var stdin = bufio.NewReader(os.Stdin)

// waitLine reads one line from stdin (the parent's go-ahead).
func waitLine() { _, _ = stdin.ReadString('\n') }

// waitEOF waits for the parent to close stdin.
func waitEOF() { _, _ = io.Copy(io.Discard, stdin) }
