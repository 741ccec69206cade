package xproc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
)

// The trials of a shared ledger under many processes: kills, a stopped
// lock holder, a dead wanter, fan-out and a corrupted file, each with
// MEMGEN_XPROC_MEMBERS processes (a list: make xproc-trials runs 8, 16 and
// 32; 4 by default, the bounded version the test command runs) and
// MEMGEN_XPROC_TRIAL_KILLS kills (5 by default). The figures are printed,
// not judged: reclaim and Inspect latencies, the waiter's bound, the bytes
// freed for a dead process. What is checked is what must hold however
// loaded the machine: no drift, no driver out-of-memory error from the
// simulated device whose capacity is the ledger's (the CUDA mechanism's
// default configuration), a typed error for every refusal, no process
// dying of a bad file.
func TestTrials(t *testing.T) {
	members := []int{4}
	if v := os.Getenv("MEMGEN_XPROC_MEMBERS"); v != "" {
		members = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 || n > 60 {
				t.Fatalf("MEMGEN_XPROC_MEMBERS=%q: want a list of 1 to 60", v)
			}
			members = append(members, n)
		}
	}
	kills := envInt("MEMGEN_XPROC_TRIAL_KILLS", 5)
	for _, n := range members {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			t.Run("kill and stop", func(t *testing.T) { killAndStopTrial(t, n, kills) })
			t.Run("dead want", func(t *testing.T) { deadWantTrial(t, n) })
			t.Run("fan-out", func(t *testing.T) { boundedAnswers(t, n) })
			t.Run("bad file", func(t *testing.T) { badFileTrial(t, n) })
		})
	}
}

// percentiles formats the median, 99th percentile and worst of ds.
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("median %v, p99 %v, worst %v (%d)", r(ds[len(ds)/2]), r(ds[len(ds)*99/100]), r(ds[len(ds)-1]), len(ds))
}

// inspector reads the ledger at path every 5 ms until stopped, recording
// how long each Inspect took; an Inspect that fails is an error.
type inspector struct {
	mu   sync.Mutex
	took []time.Duration
	errs []error
	stop chan struct{}
	done chan struct{}
	gate sync.Mutex // held around each Inspect; the trial holds it while a lock holder is stopped
}

func inspect5ms(path string) *inspector {
	in := &inspector{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(in.done)
		for {
			select {
			case <-in.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			in.gate.Lock()
			start := time.Now()
			_, _, err := Inspect(path)
			d := time.Since(start)
			in.gate.Unlock()
			in.mu.Lock()
			if err != nil {
				in.errs = append(in.errs, err)
			} else {
				in.took = append(in.took, d)
			}
			in.mu.Unlock()
		}
	}()
	return in
}

func (in *inspector) end() ([]time.Duration, []error) {
	close(in.stop)
	<-in.done
	return in.took, in.errs
}

// killAndStopTrial: n processes churn CUDA memory (commits, decommits,
// allocations, settles) on one simulated device whose capacity is the
// ledger's, with the mechanism's default pool; kills of random ones at
// random points, each replaced, while Inspect runs every 5 ms; then one
// member stopped while it holds the lock, and a reservation with
// context.Background() behind it; then every process killed.
func killAndStopTrial(t *testing.T, n, kills int) {
	pause := os.Getenv(churnPauseEnv)
	size := uint64(n) * 12 * chunk
	dev := createLiveDevice(t, size)
	path := ledgerPath(t)
	_, a, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: size, Slots: n + 4}, Poll: 100 * time.Millisecond})
	next := 0
	start := func() *proc {
		next++
		p := spawn(t, "cudachurn", pathEnv+"="+path, poolEnv+"="+dev, seedEnv+"="+strconv.Itoa(next), churnPauseEnv+"="+pause)
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
		select {
		case s := <-p.lines:
			if s != "ready" && s != "refused" {
				t.Fatalf("child %d: %q", p.pid, s)
			}
		case <-time.After(watchdog.Bound):
			p.stacks()
			t.Fatalf("watchdog: child %d: no ready within %v; its goroutines' stacks are above (SIGQUIT)", p.pid, watchdog.Bound)
		}
		return p
	}
	ps := make([]*proc, n)
	for i := range ps {
		ps[i] = start()
	}
	in := inspect5ms(path)
	gone := func(p *proc, killed time.Time) time.Duration {
		for {
			_, s, err := Inspect(path)
			if err == nil && !slices.ContainsFunc(s, func(x Slot) bool { return x.PID == p.pid }) {
				return time.Since(killed)
			}
			if time.Since(killed) > watchdog.Bound {
				t.Fatalf("watchdog: child %d not reclaimed within %v (last Inspect: %v)", p.pid, watchdog.Bound, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	var reclaims, reaps []time.Duration // per kill
	var reapMu sync.Mutex
	var reaping sync.WaitGroup
	defer reaping.Wait()
	// kill kills p and measures how long until its slot is gone (reclaim)
	// and until the kernel let its parent reap it.
	kill := func(p *proc) {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		reapMu.Lock()
		i := len(reaps)
		reaps = append(reaps, 0)
		reapMu.Unlock()
		reaping.Add(1)
		go func() {
			defer reaping.Done()
			_ = p.cmd.Wait()
			reapMu.Lock()
			reaps[i] = time.Since(killed)
			reapMu.Unlock()
		}()
		reclaims = append(reclaims, gone(p, killed))
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 6))
	for range kills {
		time.Sleep(time.Duration(rng.IntN(200_000)) * time.Microsecond)
		k := rng.IntN(n)
		kill(ps[k])
		ps[k] = start()
	}

	// A member stopped while it holds the lock, and a reservation with no
	// deadline behind it.
	in.gate.Lock() // the inspector waits while the lock is held
	holder := spawn(t, "holdlock", pathEnv+"="+path)
	holder.expect(t, "locked")
	if err := holder.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	took, d, waitErr := bounded(watchdog.Bound, func() error {
		gr, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 4 * chunk})
		if err == nil {
			_ = gr.Cancel()
			return errors.New("served behind a stopped lock holder")
		}
		return err
	})
	var le *lockError
	typed := errors.As(waitErr, &le) && len(le.Holders) == 1 && le.Holders[0].PID == holder.pid && le.Holders[0].State == "stopped"
	_ = holder.cmd.Process.Signal(syscall.SIGCONT)
	fmt.Fprintln(holder.in, "go")
	<-d
	holder.finish(t)
	in.gate.Unlock()
	if !typed {
		t.Errorf("a reservation with no deadline behind a stopped lock holder: %v after %v, want a *LockError naming pid %d as stopped", waitErr, took, holder.pid)
	}

	inspects, errs := in.end()
	for _, p := range ps {
		kill(p)
	}
	reaping.Wait()
	// The ledger's part: from the moment the kernel let the parent reap
	// the process (it had released everything) to its slot gone.
	var after []time.Duration
	for i, r := range reclaims {
		after = append(after, max(r-reaps[i], 0))
	}
	ld, err := openLiveDevice(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer ld.f.Close()
	oom := atomic.LoadUint64(ld.w(1))
	h, s := inspect(t, path)
	drift := h.Claimed != 0 || h.Reserved != 0 || h.Charged != 0 || h.Pending != 0 || h.Private != 0 || h.Want != 0 || h.Dirty
	for _, x := range s {
		drift = drift || x.PID != 0 && x.PID != os.Getpid()
	}
	t.Logf("%d members (churn pause %q), %d kills: reclaim %s; the kernel's part (killed to reaped) %s; the ledger's part (reaped to reclaimed) %s; Inspect every 5 ms: %s, %d failed; driver out-of-memory errors %d; drift %v; a context.Background() reservation behind a stopped lock holder: %v after %v",
		n, pause, kills+n, percentiles(reclaims), percentiles(reaps), percentiles(after), percentiles(inspects), len(errs), oom, drift, waitErr, took.Round(time.Millisecond))
	for _, e := range errs[:min(len(errs), 3)] {
		t.Errorf("Inspect: %v", e)
	}
	if oom != 0 {
		t.Errorf("%d driver out-of-memory errors with the default configuration", oom)
	}
	if drift {
		t.Errorf("drift after every process died: %+v, slots %v", h, s)
	}
}

// deadWantTrial: n processes hold memory and poll once an hour (no
// settle, no watcher round of their own) while another posts a want and is
// killed; then each is told to settle: nothing is freed for the dead
// process, and its slot and want are gone.
func deadWantTrial(t *testing.T, n int) {
	const held = 15 * 64 << 10
	path := ledgerPath(t)
	// Not a member here: this process's watcher would reclaim the dead
	// wanter's slot before the others settle.
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: uint64(n) * held, Slots: n + 2}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var ps []*proc
	for range n {
		p := spawn(t, "cache", pathEnv+"="+path, pollEnv+"=1h")
		p.expect(t, "ready")
		ps = append(ps, p)
	}
	w := spawn(t, "want", pathEnv+"="+path, wantEnv+"="+strconv.Itoa(4*held))
	w.expect(t, "wanting")
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	start := time.Now()
	for _, p := range ps {
		fmt.Fprintln(p.in, "settle")
		p.expect(t, "settled")
	}
	for {
		h, s, err := Inspect(path)
		if err == nil && h.Want == 0 && !slices.ContainsFunc(s, func(x Slot) bool { return x.PID == w.pid }) {
			break
		}
		if time.Since(start) > watchdog.Bound {
			t.Fatalf("watchdog: the dead wanter's slot or want still there after %v: %+v, %v", watchdog.Bound, h, err)
		}
		time.Sleep(time.Millisecond)
	}
	gone := time.Since(start)
	var tickets, freed uint64
	for _, p := range ps {
		p.in.Close()
		f := p.expect(t, "tickets")
		tickets += atoi(t, f[0])
		freed += atoi(t, f[1])
		p.expect(t, "done")
		if err := p.cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d members, a want of %d bytes whose process died: reclaimed %v after the members were told to settle; %d tickets, %d bytes freed for it",
		n, 4*held, gone.Round(time.Millisecond), tickets, freed)
	if freed != 0 {
		t.Errorf("%d bytes freed for a process that had died", freed)
	}
}

// badFileTrial: n processes hold memory and settle every Poll when a bit
// of one of their slots flips (a stray write into the file): Inspect and
// every member refuse the file with ErrCorrupt, and no process dies of it.
func badFileTrial(t *testing.T, n int) {
	const held = 15 * 64 << 10
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: uint64(n) * held, Slots: n + 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := l.Close(); !errors.Is(err, errCorrupt) {
			t.Errorf("Close of a corrupt ledger: %v, want ErrCorrupt", err)
		}
	}()
	var ps []*proc
	for range n {
		p := spawn(t, "cache", pathEnv+"="+path)
		p.expect(t, "ready")
		ps = append(ps, p)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, s := inspect(t, path)
	i := slices.IndexFunc(s, func(x Slot) bool { return x.PID == ps[0].pid })
	off := int64(headerSize + i*slotSize + sStart*8)
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 8
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	time.Sleep(300 * time.Millisecond) // every member has tried the lock
	_, _, ierr := Inspect(path)
	// A member killed here was running; one that exited had stopped on its
	// error; one that died of a signal of its own, or panicked, crashed.
	running, stopped, crashed := 0, 0, 0
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		_ = p.cmd.Wait()
		st := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		switch {
		case st.Signaled() && st.Signal() == syscall.SIGKILL:
			running++
		case st.Exited() && st.ExitStatus() == 1:
			stopped++
		default:
			crashed++
		}
	}
	t.Logf("%d members, a bit of a slot flipped: Inspect %v; after 300 ms %d members running, %d stopped on their error, %d crashed", n, ierr, running, stopped, crashed)
	if !errors.Is(ierr, errCorrupt) {
		t.Errorf("Inspect of a ledger with a flipped slot bit: %v, want ErrCorrupt", ierr)
	}
	if crashed != 0 {
		t.Errorf("%d of %d members crashed on a corrupt file", crashed, n)
	}
}
