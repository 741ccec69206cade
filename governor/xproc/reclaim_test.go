package xproc

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
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
// asked; it returns the lease.
func slowCache(t *testing.T, a *Authority, g *governor.Governor, n memapi.Bytes, hold time.Duration) *governor.Lease {
	t.Helper()
	var lp atomic.Pointer[governor.Lease]
	slow := governor.HolderFunc(func(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		time.Sleep(hold)
		ls := lp.Load()
		if ls == nil {
			return 0, nil
		}
		k := min(tk.Wanted, ls.Charged())
		return k, ls.Refund(k)
	})
	if err := g.Register("slow", slow, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	gr, err := a.Reserve(context.Background(), "slow", "blocks", n, 0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	_ = gr.Draw(n)
	ls, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	lp.Store(ls)
	return ls
}

// A death is reclaimed while the watcher's process answers another's want
// through a holder that takes its time: the reclaim does not wait for the
// answer (it used to, one settle at a time in one goroutine).
func TestReclaimNotBehindAnAnswer(t *testing.T) {
	path := ledgerPath(t)
	// B joins first with an idle watcher: only A's watcher sees C die.
	_, b, _ := member(t, path, 0, Options{Create: &CreateOptions{Capacity: 1 << 20, Slots: 8}, Poll: time.Hour})
	events := make(chan Event, 8)
	_, a, ga := member(t, path, 0, Options{OnEvent: func(e Event) {
		if e.Kind == EventReclaimed {
			events <- e
		}
	}})
	ls := slowCache(t, a, ga, 768<<10, 2500*time.Millisecond)
	defer func() { _ = ls.Refund(ls.Charged()) }()
	p := spawn(t, "idle", pathEnv+"="+path)
	p.expect(t, "ready")
	time.Sleep(100 * time.Millisecond) // A's watcher holds C's pidfd
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	go func() {
		if gr, err := b.Reserve(ctx, "h", "r", 512<<10, 0, time.Time{}); err == nil {
			_ = gr.Cancel()
		}
	}()
	time.Sleep(200 * time.Millisecond) // A answers: its holder sleeps
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
		if d := time.Since(killed); d > time.Second {
			t.Fatalf("the death was reclaimed %v after the kill: behind the answer", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not reclaimed within 5 s")
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
	ls := slowCache(t, a, ga, 768<<10, 2500*time.Millisecond)
	defer func() { _ = ls.Refund(ls.Charged()) }()
	bctx, bcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer bcancel()
	go func() {
		if gr, err := b.Reserve(bctx, "h", "r", 512<<10, 0, time.Time{}); err == nil {
			_ = gr.Cancel()
		}
	}()
	time.Sleep(200 * time.Millisecond) // A answers: its holder sleeps
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	gr, err := a.Reserve(ctx, "h", "r", 512<<10, 0, time.Time{})
	took := time.Since(start)
	if err == nil {
		_ = gr.Cancel()
	}
	t.Logf("%v after %v", err, took)
	// A second of slack for a loaded machine under -race: behind the
	// answer it takes 2.3 s.
	if !isOverBudget(err) || took > deadline+time.Second {
		t.Fatalf("a reservation with a %v deadline: %v after %v, want ErrOverBudget at its deadline", deadline, err, took)
	}
	bcancel()
}
