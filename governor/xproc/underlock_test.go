package xproc

import (
	"context"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
)

// deadPID is the PID of a process that ran and was reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// plantDead writes into a free slot of l's ledger a member that is gone
// (a reaped process's PID) claiming claim bytes, with a want of want bytes
// when want is not 0, and returns the slot.
func plantDead(t *testing.T, l *Ledger, claim, want uint64) int {
	t.Helper()
	pid := deadPID(t)
	if err := l.lock(context.Background(), "test"); err != nil {
		t.Fatal(err)
	}
	defer l.unlock()
	for i := 0; i < l.slots; i++ {
		if l.load(l.sw(i, sPID)) != 0 {
			continue
		}
		l.store(l.sw(i, sStart), 1)
		l.store(l.sw(i, sPID), uint64(pid))
		l.store(l.sw(i, sClaim), claim)
		l.add(l.hw(hClaimed), claim)
		if want != 0 {
			l.store(l.sw(i, sWant), want)
			l.store(l.sw(i, sWantLeft), want)
			l.add(l.sw(i, sWantSeq), 1)
			l.add(l.hw(hWantSeq), 1)
		}
		return i
	}
	t.Fatal("no free slot to plant a dead member in")
	return -1
}

// holdLiveness makes the next liveness read of another process than this
// one (which reads its own start time as it joins) wait until the
// returned release is called; entered is closed once it waits.
func holdLiveness(t *testing.T) (entered chan struct{}, release func()) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	hook := func(pid int) {
		if pid != os.Getpid() && armed.CompareAndSwap(true, false) {
			close(entered)
			<-gate
		}
	}
	livenessHook.Store(&hook)
	var once atomic.Bool
	release = func() {
		if once.CompareAndSwap(false, true) {
			livenessHook.Store(nil)
			close(gate)
		}
	}
	t.Cleanup(release)
	return entered, release
}

// Liveness is read outside the ledger's lock: no /proc read and no pidfd
// open while a member holds it, so a slow /proc (a loaded machine, dozens
// of members, a process stuck in the kernel) never keeps the others out.
// Each scenario holds the first liveness read until an Inspect, which
// needs the lock, has returned: a read made under the lock would keep it
// out until its deadline.
func TestNoLivenessReadUnderTheLock(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, path string) (trigger func() error)
	}{
		{"claim", func(t *testing.T, path string) func() error {
			l, a, _ := member(t, path, 1<<20, Options{Poll: time.Hour})
			plantDead(t, l, 1<<20, 0)
			return func() error {
				gr, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 256 << 10})
				if err != nil {
					return err
				}
				return gr.Cancel()
			}
		}},
		{"join", func(t *testing.T, path string) func() error {
			l, _, _ := member(t, path, 1<<20, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 2}, Poll: time.Hour})
			plantDead(t, l, 0, 0)
			return func() error {
				l2, err := Open(path, Options{Poll: time.Hour})
				if err == nil {
					err = l2.Close()
				}
				return err
			}
		}},
		{"watch", func(t *testing.T, path string) func() error {
			// A watcher polling every 20 ms finds the dead member in its
			// next round.
			l, _, _ := member(t, path, 1<<20, Options{Poll: 20 * time.Millisecond})
			return func() error { plantDead(t, l, 0, 0); return nil }
		}},
		{"settle", func(t *testing.T, path string) func() error {
			l, a, _ := member(t, path, 1<<20, Options{Poll: time.Hour})
			plantDead(t, l, 64<<10, 64<<10)
			return a.Settle
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := ledgerPath(t)
			trigger := c.setup(t, path)
			entered, release := holdLiveness(t)
			done := make(chan error, 1)
			go func() { done <- trigger() }()
			select {
			case <-entered:
			case <-time.After(watchdog.Bound):
				t.Fatalf("watchdog: %s read no liveness in %v", c.name, watchdog.Bound)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _, err := InspectContext(ctx, path)
			cancel()
			release()
			if err != nil {
				t.Errorf("%s: a liveness read held the ledger's lock: %v", c.name, err)
			}
			if err := <-done; err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		})
	}
}
