package governor

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

const hostQ memapi.AuthorityID = "q"

// hooked is a governor whose event hook calls on for every event.
func hooked(t *testing.T, capacity memapi.Bytes, on func(Event)) *Governor {
	t.Helper()
	g := New(Options{OnEvent: func(e Event) {
		if on != nil {
			on(e)
		}
	}})
	if err := g.AddAuthority(hostQ, capacity); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	for _, id := range []HolderID{"a", "b"} {
		if err := g.Register(id, nil, HolderOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

func snap(t *testing.T, g *Governor) AuthoritySnapshot {
	t.Helper()
	s, _ := g.Authority(hostQ)
	if !s.Balanced() {
		t.Fatalf("unbalanced %+v", s)
	}
	return s
}

// An event hook that panicked on EventPressure, emitted before the
// wait had armed its cleanup, stranded the waiter, and a later refund gave
// it a grant nobody owned.
func TestPanickingPressureHookLeavesNoWaiter(t *testing.T) {
	var arm atomic.Bool
	g := hooked(t, 100, func(e Event) {
		if e.Kind == EventPressure && arm.Load() {
			panic("hook bug")
		}
	})
	gr, err := g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "a", Role: "", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	arm.Store(true)
	func() {
		defer func() {
			if r := recover(); r != "hook bug" {
				t.Fatalf("recovered %v", r)
			}
		}()
		g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "b", Role: "", Bytes: 50})
		t.Fatal("Reserve returned")
	}()
	if s := snap(t, g); s.Waiters != 0 || s.WaitingBytes != 0 {
		t.Fatalf("a waiter was stranded: %+v", s)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if s := snap(t, g); s.Reserved != 0 || s.Grants != 0 {
		t.Fatalf("a grant nobody owns: %+v", s)
	}
}

// A hook that panics on EventServed would strand the served grant: it goes
// back first.
func TestPanickingServedHookReturnsTheGrant(t *testing.T) {
	g := hooked(t, 100, func(e Event) {
		if e.Kind == EventServed {
			panic("hook bug")
		}
	})
	gr, err := g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "a", Role: "", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "b", Role: "", Bytes: 50})
	}()
	for snap(t, g).Waiters == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	r := watchdog.Recv(t, watchdog.Bound, "the reservation was not served", done)
	if r != "hook bug" {
		t.Fatalf("recovered %v", r)
	}
	if s := snap(t, g); s.Reserved != 0 || s.Grants != 0 {
		t.Fatalf("a grant nobody owns: %+v", s)
	}
}

// Also: a reservation's deadline did not bound the ctx handed to a
// holder's Reclaim, so a Reclaim waiting on its ctx kept Reserve blocked.
func TestReclaimContextEndsAtTheDeadline(t *testing.T) {
	g := New(Options{})
	t.Cleanup(func() { _ = g.Close() })
	if err := g.AddAuthority(hostQ, 100); err != nil {
		t.Fatal(err)
	}
	cause := make(chan error, 1)
	slow := HolderFunc(func(ctx context.Context, _ Ticket) (memapi.Bytes, error) {
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return 0, nil
	})
	if err := g.Register("slow", slow, HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("req", nil, HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	gr, _ := g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "slow", Role: "", Bytes: 100})
	_ = gr.Draw(100)
	l, _ := gr.Commit()
	defer l.release()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	_, err := g.Reserve(ctx, Request{Authority: hostQ, Holder: "req", Role: "", Bytes: 50, Deadline: time.Now().Add(20 * time.Millisecond)})
	mustKind(t, err, memapi.ErrOverBudget)
	if c := watchdog.Recv(t, bound, "Reclaim's context ending", cause); !errors.Is(c, context.DeadlineExceeded) {
		t.Fatalf("Reclaim's ctx ended by %v, not by the reservation's deadline", c)
	}
	if ctx.Err() != nil {
		t.Fatal("Reserve outlived its deadline until the watchdog")
	}
}

// Behaviour: a grant served at the instant its wait was abandoned goes
// back; the failed Reserve leaves the ledger as it found it.
func TestGrantServedAsTheWaitEndsGoesBack(t *testing.T) {
	for range 40 {
		var gr Grant
		var cancel context.CancelFunc
		g := hooked(t, 100, nil)
		g.onEvent = func(e Event) {
			if e.Kind == EventWaiting {
				// Both at once: the wait ends and the waiter is served.
				cancel()
				_ = gr.Cancel()
			}
		}
		var err error
		gr, err = g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "a", Role: "", Bytes: 100})
		if err != nil {
			t.Fatal(err)
		}
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		got, err := g.Reserve(ctx, Request{Authority: hostQ, Holder: "b", Role: "", Bytes: 50})
		cancel()
		s := snap(t, g)
		switch {
		case err == nil && (s.Reserved != 50 || got == (Grant{})):
			t.Fatalf("served: %+v", s)
		case err != nil && (s.Reserved != 0 || s.Grants != 0):
			t.Fatalf("failed Reserve kept its grant: %+v", s)
		}
		if got != (Grant{}) {
			_ = got.Cancel()
		}
		_ = g.Close()
	}
}

// Behaviour: a whole refund serves a waiting reservation.
func TestRefundFastPathWakesWaiters(t *testing.T) {
	g := hooked(t, 100, nil)
	gr, err := g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "a", Role: "", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() {
		_, err := g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "b", Role: "", Bytes: 50})
		ch <- err
	}()
	for snap(t, g).Waiters == 0 {
		time.Sleep(100 * time.Microsecond)
	}
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if n := l.release(); n != 100 {
		t.Fatalf("released %d", n)
	}
	err = watchdog.Recv(t, watchdog.Bound, "the waiter woken by the refund", ch)
	if err != nil {
		t.Fatal(err)
	}
}

// Behaviour: undrawing an expired grant returns its bytes and serves a
// waiting reservation.
func TestUndrawOfExpiredGrantServesWaiters(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostQ: 100})
	h.register("a", nil, HolderOptions{})
	h.register("b", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostQ, Holder: "a", Role: "", Bytes: 100, Deadline: h.clock.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(2 * time.Second) // expired: the drawn bytes stay reserved
	ch := h.reserveAsync(context.Background(), hostQ, "b", 50, 0, time.Time{})
	h.awaitWaiting("b")
	if err := gr.Undraw(100); err != nil {
		t.Fatal(err)
	}
	if r := await(t, ch); r.err != nil {
		t.Fatal(r.err)
	}
}

// Quarantined bytes stay charged, show apart, are never asked for by a
// ticket, and leave through QuarantinedAccount.
func TestQuarantinedBytesAreVisibleAndNotReclaimable(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostQ: 100})
	h.register("kv", HolderFunc(func(context.Context, Ticket) (memapi.Bytes, error) { return 0, nil }), HolderOptions{})
	l := h.lease(hostQ, "kv", 60)
	if err := l.MarkPending(60); err != nil {
		t.Fatal(err)
	}
	if err := l.Quarantine(40); err != nil {
		t.Fatal(err)
	}
	s := h.auth(hostQ)
	if s.Charged != 40 || s.Pending != 20 || s.Quarantined != 40 || s.Reclaimable != 0 {
		t.Fatalf("%+v", s)
	}
	hs := h.g.Snapshot().Holders[0].Authorities[0]
	if hs.Quarantined != 40 || hs.Charged != 40 {
		t.Fatalf("%+v", hs)
	}
	mustKind(t, l.MarkPending(1), errOverReturn)
	mustKind(t, l.refundQuarantined(41), errOverReturn)
	if err := l.Refund(20); err != nil { // the pending bytes freed
		t.Fatal(err)
	}
	if err := l.refundQuarantined(40); err != nil { // the retry freed the rest
		t.Fatal(err)
	}
	if s := h.auth(hostQ); s.Charged != 0 || s.Quarantined != 0 || s.Leases != 0 || s.Free != 100 {
		t.Fatalf("%+v", s)
	}
}
