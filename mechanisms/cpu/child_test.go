package cpu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// Some behaviour can only be seen in a process of its own: a write that
// kills it, a resource limit. Those tests re-execute the test binary with
// childEnv naming the scenario; TestMain runs it and exits.
const childEnv = "MEMGEN_CPU_CHILD"

func runChild(name string) int {
	var err error
	switch name {
	case "readonly-write":
		err = childReadOnlyWrite()
	case "commit-oom":
		err = childCommitOOM()
	case "map-count":
		err = childMapCount()
	default:
		err = fmt.Errorf("unknown child scenario %q", name)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	fmt.Println("child: ok")
	return 0
}

// child starts the test binary running scenario name and returns its
// combined output and exit state.
func child(t *testing.T, name string) (string, *os.ProcessState) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+name)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running the child: %v", err)
	}
	return string(out), cmd.ProcessState
}

// TestReadOnlyViewWriteFaults writes to a read-only view with a plain host
// store in a child process whose SIGSEGV handler is the kernel default, and
// checks that the kernel killed it with SIGSEGV right at that store.
func TestReadOnlyViewWriteFaults(t *testing.T) {
	out, st := child(t, "readonly-write")
	ws := st.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Fatalf("child exited with %v, want death by SIGSEGV; output:\n%s", st, out)
	}
	if !strings.Contains(out, "read-write view written") || !strings.Contains(out, "writing the read-only view") {
		t.Fatalf("child died before the read-only write; output:\n%s", out)
	}
	if strings.Contains(out, "survived") {
		t.Fatalf("the write to the read-only view did not fault; output:\n%s", out)
	}
}

func childReadOnlyWrite() error {
	m, err := New(Options{Granularity: Granularity4KiB})
	if err != nil {
		return err
	}
	n := memapi.Bytes(pageSize)
	b, err := m.CreateBacking(bg, n, g)
	if err != nil {
		return err
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * n})
	if err != nil {
		return err
	}
	rw, err := m.MapView(bg, res, memapi.Range{Off: 0, Len: n}, b, memapi.AccessReadWrite)
	if err != nil {
		return err
	}
	ro, err := m.MapView(bg, res, memapi.Range{Off: n, Len: n}, b, memapi.AccessReadOnly)
	if err != nil {
		return err
	}
	m.mu.RLock()
	rwp, _ := m.span("child", res.Addr()+memapi.DeviceAddr(rw.Range().Off), n, true)
	rop, _ := m.span("child", res.Addr()+memapi.DeviceAddr(ro.Range().Off), n, false)
	m.mu.RUnlock()
	*(*byte)(rwp) = 42
	if *(*byte)(rop) != 42 {
		return errors.New("the read-only view does not see the read-write view's write")
	}
	fmt.Println("read-write view written")
	// Give SIGSEGV back to the kernel's default action, so the fault kills
	// the process instead of becoming a Go runtime panic.
	var act [4]uint64 // struct sigaction, all zero: SIG_DFL
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGSEGV), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); errno != 0 {
		return errno
	}
	fmt.Println("writing the read-only view")
	os.Stdout.Sync()
	*(*byte)(rop) = 7
	fmt.Println("survived")
	return errors.New("the write to a read-only view did not fault")
}

// TestCommitOutOfMemory runs a commit in a child whose RLIMIT_DATA leaves
// room for the Go runtime but not for the commit: mprotect read-write fails
// with ENOMEM, Commit returns ErrOutOfMemory, and nothing changed.
func TestCommitOutOfMemory(t *testing.T) {
	out, st := child(t, "commit-oom")
	t.Log(out)
	if !st.Success() || !strings.Contains(out, "child: ok") {
		t.Fatalf("child failed (%v):\n%s", st, out)
	}
}

func childCommitOOM() error {
	m, err := New(Options{})
	if err != nil {
		return err
	}
	const chunk = 2 << 20
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 256 << 20})
	if err != nil {
		return err
	}
	if err := m.Commit(bg, res, memapi.Range{Off: 0, Len: chunk}, g); err != nil {
		return err
	}
	used, committed := m.UsedBytes(), memapi.Bytes(chunk)
	data, err := vmDataBytes()
	if err != nil {
		return err
	}
	limit := data + 64<<20 // headroom for the Go heap
	if err := unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		return err
	}
	big := memapi.Range{Off: chunk, Len: 128 << 20}
	err = m.Commit(bg, res, big, g)
	if !errors.Is(err, memapi.ErrOutOfMemory) || !errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("commit over RLIMIT_DATA returned %v, want ErrOutOfMemory with ENOMEM", err)
	}
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != big.Len || me.Handle != res.ID() {
		return fmt.Errorf("error %#v does not carry the figures", err)
	}
	fmt.Println("commit refused:", err)
	if c, _ := m.CommittedBytes(res); c != committed || m.UsedBytes() != used {
		return fmt.Errorf("state changed: committed %d (want %d), used %d (want %d)", c, committed, m.UsedBytes(), used)
	}
	if k, err := m.KernelBytes(); err != nil || k != used {
		return fmt.Errorf("kernel reports %d bytes (%v), want %d", k, err, used)
	}
	// The refused range is still reserved space nothing can touch.
	m.mu.RLock()
	_, serr := m.span("child", res.Addr()+memapi.DeviceAddr(big.Off), big.Len, false)
	m.mu.RUnlock()
	if !errors.Is(serr, memapi.ErrNotCommitted) {
		return fmt.Errorf("refused range is not uncommitted: %v", serr)
	}
	// Through the checked wrapper the ledger is as it was: the draw is undone.
	gr := fakes.NewGrant(m.Info().Authority, 1<<30)
	vb, _ := checked.Wrap(m, fakes.Ledger, checked.WithVerify()).AsVirtualBacking()
	if err := vb.Commit(bg, res, big, gr); !errors.Is(err, memapi.ErrOutOfMemory) {
		return fmt.Errorf("checked commit over RLIMIT_DATA returned %v", err)
	}
	if gr.Drawn() != 0 || m.UsedBytes() != used {
		return fmt.Errorf("a refused commit left %d drawn from the grant, used %d", gr.Drawn(), m.UsedBytes())
	}
	// An allocation over the limit is refused the same way.
	if _, err := m.Allocate(bg, memapi.AllocRequest{Size: 128 << 20}, g); !errors.Is(err, memapi.ErrOutOfMemory) {
		return fmt.Errorf("allocate over RLIMIT_DATA returned %v", err)
	}
	// What fits still commits.
	if err := m.Commit(bg, res, memapi.Range{Off: chunk, Len: chunk}, g); err != nil {
		return fmt.Errorf("a commit within the limit failed: %v", err)
	}
	return m.ReleaseReservation(bg, res, g)
}

// vmDataBytes reads VmData (the mappings RLIMIT_DATA counts) from
// /proc/self/status.
func vmDataBytes() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmData:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmData in /proc/self/status")
}
