package xproc

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// admitMember is member with the governor's events sent to onEvent and the
// watcher idle (an hour's Poll), so only the test settles and claims.
func admitMember(t *testing.T, capacity uint64, onEvent func(governor.Event)) (*Ledger, *Authority, *governor.Governor) {
	t.Helper()
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: capacity, Slots: 4}, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	g := governor.New(governor.Options{OnEvent: onEvent})
	a, err := l.Bind(g, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Register("h", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		g.Close()
	})
	return l, a, g
}

// claimsEqualReserved checks that this process claims exactly what its
// authority has reserved, charged and pending: no spare claim.
func claimsEqualReserved(t *testing.T, l *Ledger, g *governor.Governor) {
	t.Helper()
	s, _ := g.Authority("dev")
	_, slots := inspect(t, l.path)
	if used := s.Reserved + s.Charged + s.Pending; memapi.Bytes(slots[l.Slot()].Claim) != used || s.Capacity != used {
		t.Fatalf("claim %d, local capacity %d, reserved+charged+pending %d: want all equal", slots[l.Slot()].Claim, s.Capacity, used)
	}
}

// A reservation behind a waiter is asked the waiter's bytes and its own
// beyond the free ones; the claim is made under the Authority's lock,
// after a settle may have served the waiter already. It claimed that stale
// figure: here 3,800 bytes for a reservation of 100 once the waiter was
// served, which the ledger could not give, so a reservation that needed
// 100 of the 300 unclaimed bytes was refused. Now the claim is the
// shortfall seen under the lock, and the claims equal what is reserved.
func TestAdmitClaimsTheShortfallSeenUnderItsLock(t *testing.T) {
	waiting := make(chan struct{}, 8)
	l, a, g := admitMember(t, 4000, func(e governor.Event) {
		if e.Kind == governor.EventWaiting {
			waiting <- struct{}{}
		}
	})
	entered := make(chan struct{})
	a.beforeClaim = func(bytes memapi.Bytes) {
		if bytes == 100 {
			close(entered)
		}
	}
	ctx := context.Background()
	g1, err := a.Reserve(ctx, "h", "first", 400, 0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// W waits for 3,700: more than the 3,600 the ledger has unclaimed.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		gr  *governor.Grant
		err error
	}
	wc := make(chan result, 1)
	go func() {
		gr, err := a.Reserve(wctx, "h", "waiter", 3700, 0, time.Time{})
		wc <- result{gr, err}
	}()
	<-waiting
	// R arrives behind W and stops before its claim, while this test
	// holds the Authority's lock: the first grant goes back and a settle
	// claims what W lacks, serving it.
	a.mu.Lock()
	rc := make(chan result, 1)
	go func() {
		gr, err := a.Reserve(ctx, "h", "late", 100, 0, time.Time{})
		rc <- result{gr, err}
	}()
	<-entered
	if err := g1.Cancel(); err != nil {
		t.Error(err)
	}
	a.claimWaitersLocked()
	a.mu.Unlock()
	w := <-wc
	if w.err != nil {
		t.Fatalf("the waiter: %v", w.err)
	}
	r := <-rc
	if r.err != nil {
		t.Fatalf("the reservation behind the served waiter: %v (it needs 100 of the 300 unclaimed bytes)", r.err)
	}
	claimsEqualReserved(t, l, g)
	if err := w.gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := r.gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	claimsEqualReserved(t, l, g)
}
