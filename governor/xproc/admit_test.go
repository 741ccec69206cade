package xproc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// admitMember is member with the governor's events sent to onEvent and the
// watcher idle (an hour's Poll), so only the test settles and claims.
func admitMember(t *testing.T, capacity uint64, onEvent func(governor.Event)) (*Ledger, *authority, *governor.Governor) {
	t.Helper()
	path := ledgerPath(t)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: capacity, Slots: 4}, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	g := governor.New(governor.Options{OnEvent: onEvent})
	a, err := l.bind(g, "dev")
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
	if used := s.Reserved + s.Charged + s.Pending; memapi.Bytes(slots[l.slot].Claim) != used || s.Capacity != used {
		t.Fatalf("claim %d, local capacity %d, reserved+charged+pending %d: want all equal", slots[l.slot].Claim, s.Capacity, used)
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
	g1, err := a.Reserve(ctx, governor.Request{Holder: "h", Role: "first", Bytes: 400})
	if err != nil {
		t.Fatal(err)
	}
	// W waits for 3,700: more than the 3,600 the ledger has unclaimed.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		gr  governor.Grant
		err error
	}
	wc := make(chan result, 1)
	go func() {
		gr, err := a.Reserve(wctx, governor.Request{Holder: "h", Role: "waiter", Bytes: 3700})
		wc <- result{gr, err}
	}()
	<-waiting
	// R arrives behind W and stops before its claim, while this test
	// holds the Authority's lock: the first grant goes back and a settle
	// claims what W lacks, serving it.
	a.sem <- struct{}{}
	rc := make(chan result, 1)
	go func() {
		gr, err := a.Reserve(ctx, governor.Request{Holder: "h", Role: "late", Bytes: 100})
		rc <- result{gr, err}
	}()
	<-entered
	if err := g1.Cancel(); err != nil {
		t.Error(err)
	}
	if err := a.claimWaitersLocked(context.Background()); err != nil {
		t.Error(err)
	}
	a.unacquire()
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

// The claim made for a reservation that then fails locally (here on its
// holder's limit, which another reservation of the holder reached while it
// claimed) stayed spare until the next settle. Now it goes back at once:
// the claims equal what is reserved right after the failure.
func TestAdmitGivesBackTheClaimOfAFailedReservation(t *testing.T) {
	l, a, g := admitMember(t, 4000, nil)
	if err := g.Register("lim", nil, governor.HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{"dev": 500}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var other governor.Grant
	a.beforeClaim = func(bytes memapi.Bytes) {
		if bytes != 300 {
			return
		}
		var err error
		if other, err = a.Reserve(ctx, governor.Request{Holder: "lim", Role: "other", Bytes: 400}); err != nil {
			t.Error(err)
		}
	}
	_, err := a.Reserve(ctx, governor.Request{Holder: "lim", Role: "r", Bytes: 300})
	if !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("past the limit after the claim: %v, want ErrOverLimit", err)
	}
	if other == (governor.Grant{}) {
		t.Fatal("the reservation made during the claim failed")
	}
	claimsEqualReserved(t, l, g)
	if err := other.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	claimsEqualReserved(t, l, g)
}

// ReturnAdmitted gives back at most the failed reservation's bytes: spare
// bytes beyond them stay the process's until the next settle, as freed
// bytes do, so its next reservation reuses them without the file lock.
func TestReturnAdmittedGivesBackAtMostTheReservation(t *testing.T) {
	l, a, g := admitMember(t, 4000, nil)
	ls := take(t, a, 300)
	if err := ls.Refund(300); err != nil {
		t.Fatal(err)
	}
	a.ReturnAdmitted("h", 100)
	if _, slots := inspect(t, l.path); slots[l.slot].Claim != 200 {
		t.Fatalf("claim %d after giving back 100 of 300 spare, want 200", slots[l.slot].Claim)
	}
	if err := a.Settle(); err != nil {
		t.Fatal(err)
	}
	claimsEqualReserved(t, l, g)
}

// Admit claims nothing for a reservation whose context has ended (the
// governor may call it just after): it fails with ErrOverBudget, its Err
// the context's, and the ledger is as it was. It used to claim, and the
// governor granted the reservation after its deadline.
func TestAdmitAfterItsContextEnded(t *testing.T) {
	l, a, _ := admitMember(t, 4000, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := a.Admit(ctx, "h", 100, 100, 0, true)
	var ob *governor.OverBudgetError
	if !errors.As(err, &ob) || !errors.Is(err, memapi.ErrOverBudget) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with an ended context: %v, want ErrOverBudget with the context's error", err)
	}
	if _, slots := inspect(t, l.path); slots[l.slot].Claim != 0 {
		t.Fatalf("claimed %d for a reservation whose context ended", slots[l.slot].Claim)
	}
}
