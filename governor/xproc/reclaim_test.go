package xproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
)

// childIdle: join, say "ready", and stay until EOF or killed.
func childIdle() error {
	c, err := joinCPU()
	if err != nil {
		return err
	}
	fmt.Println("ready")
	waitEOF()
	if err := c.l.Close(); err != nil {
		return err
	}
	c.g.Close()
	fmt.Println("done")
	return nil
}

// slowCache registers holder "slow" on g, holding n bytes of a, whose
// Reclaim takes hold (ignoring its context) before it frees what it is
// asked; it returns the lease and what the holder was asked.
func slowCache(t *testing.T, a *authority, g *governor.Governor, n memapi.Bytes, hold time.Duration) (governor.Lease, *slowAnswers) {
	t.Helper()
	var lp atomic.Pointer[governor.Lease]
	sa := &slowAnswers{asked: make(chan struct{})}
	var once sync.Once
	slow := governor.HolderFunc(func(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		once.Do(func() { close(sa.asked) })
		time.Sleep(hold)
		sa.returned.CompareAndSwap(0, time.Now().UnixNano())
		ls := lp.Load()
		if ls == nil {
			return 0, nil
		}
		k := min(tk.Wanted, ls.Bytes())
		return k, ls.Refund(k)
	})
	if err := g.Register("slow", slow, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	gr, err := a.Reserve(context.Background(), governor.Request{Holder: "slow", Role: "blocks", Bytes: n})
	if err != nil {
		t.Fatal(err)
	}
	_ = gr.Draw(n)
	ls, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	lp.Store(&ls)
	return ls, sa
}

// slowAnswers is what slowCache's holder was asked: asked is closed when
// its first Reclaim starts (its process is answering: a test waits for it
// rather than sleeping), returned is when that Reclaim returned
// (UnixNano; 0 before).
type slowAnswers struct {
	asked    chan struct{}
	returned atomic.Int64
}

// await waits at most 30 s for ch to be closed (a loaded machine may be
// slow to get there, but it gets there).
func await(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not within 30 s", what)
	}
}

// A death is reclaimed while the watcher's process answers another's want
// through a holder that takes its time: the reclaim does not wait for the
// answer (it used to, one settle at a time in one goroutine).
//
// The test waits for the events it needs, not for fixed sleeps: a loaded
// machine did not honour "100 ms: A's watcher holds C's pidfd" and "200 ms:
// A answers", and when B's reservation reached the ledger only after the
// kill, B's claim reclaimed C itself (a claim that does not fit reclaims
// the dead first), so A never saw the reclaim.
func TestReclaimNotBehindAnAnswer(t *testing.T) {
	path := ledgerPath(t)
	// B joins first with an idle watcher: only A's watcher sees C die.
	_, b, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 8}, Poll: time.Hour})
	events := make(chan event, 8)
	la, a, ga := member(t, path, 0, Options{onEvent: func(e event) {
		if e.Kind == eventReclaimed {
			events <- e
		}
	}})
	watched := make(chan int, 8)
	onWatch := func(_, pid int) {
		select {
		case watched <- pid:
		default:
		}
	}
	la.watching.Store(&onWatch)
	ls, sa := slowCache(t, a, ga, 768<<10, 2500*time.Millisecond)
	defer func() { _ = ls.Refund(ls.Bytes()) }()
	p := spawn(t, "idle", pathEnv+"="+path)
	p.expect(t, "ready")
	// A's watcher holds C's pidfd: C's death wakes it.
	for deadline := time.After(30 * time.Second); ; {
		select {
		case pid := <-watched:
			if pid != p.pid {
				continue // B's
			}
		case <-deadline:
			t.Fatal("A's watcher opened no pidfd on the child within 30 s")
		}
		break
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		if gr, err := b.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10}); err == nil {
			_ = gr.Cancel()
		}
	}()
	// A answers B's want: its holder sleeps. B posted the want, so its
	// claim is behind it: B's watcher is idle and it claims no more, so
	// only A's watcher can reclaim C.
	await(t, sa.asked, "A's holder was not asked for B's want")
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_ = p.cmd.Wait()
	select {
	case e := <-events:
		t.Logf("reclaimed %v after the kill", time.Since(killed))
		if e.PID != p.pid {
			t.Fatalf("reclaimed %+v, want the child %d", e, p.pid)
		}
		if at := sa.returned.Load(); at != 0 && at <= e.Time.UnixNano() {
			t.Fatalf("reclaimed %v after A's holder returned: behind the answer", e.Time.Sub(time.Unix(0, at)))
		}
	case <-time.After(watchdog.Bound):
		t.Fatalf("watchdog: not reclaimed within %v", watchdog.Bound)
	}
	cancel()
}

// A reservation on a shared authority keeps its deadline while its
// process answers another's want through a slow holder: it fails with
// ErrOverBudget at its deadline (it used to wait for the answer, and fail
// later with the mechanism's context error once granted).
func TestReserveKeepsItsDeadline(t *testing.T) {
	path := ledgerPath(t)
	_, b, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 8}, Poll: time.Hour})
	_, a, ga := member(t, path, 0, Options{})
	ls, sa := slowCache(t, a, ga, 768<<10, 2500*time.Millisecond)
	defer func() { _ = ls.Refund(ls.Bytes()) }()
	bctx, bcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer bcancel()
	go func() {
		if gr, err := b.Reserve(bctx, governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10}); err == nil {
			_ = gr.Cancel()
		}
	}()
	// A answers: its holder sleeps (a fixed sleep here let a loaded
	// machine reserve before the answer began, proving nothing).
	await(t, sa.asked, "A's holder was not asked for B's want")
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	gr, err := a.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 512 << 10})
	took := time.Since(start)
	if err == nil {
		_ = gr.Cancel()
	}
	t.Logf("%v after %v", err, took)
	// Behind the answer it would return once A's holder did (2.5 s):
	// it must return first, with ErrOverBudget (an order, not a time).
	if !isOverBudget(err) || sa.returned.Load() != 0 {
		t.Fatalf("a reservation with a %v deadline: %v after %v, want ErrOverBudget at its deadline", deadline, err, took)
	}
	bcancel()
}
