package governor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

const hostB memapi.AuthorityID = "host-b"

func mustBind(t *testing.T, g *Governor, a memapi.AuthorityID, holder HolderID) *Binding {
	t.Helper()
	bd, err := g.Bind(a, holder, "test")
	if err != nil {
		t.Fatal(err)
	}
	return bd
}

// cycle reserves n bytes through bd into gr, draws them all, commits and
// refunds: the hot path.
func cycle(t testing.TB, bd *Binding, gr *Grant, n memapi.Bytes) {
	t.Helper()
	if err := bd.ReserveInto(context.Background(), gr, n, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(n); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(n); err != nil {
		t.Fatal(err)
	}
}

func TestBindErrors(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	_, err := h.g.Bind("nope", "kv", "")
	mustKind(t, err, ErrUnknownAuthority)
	_, err = h.g.Bind(hostA, "nobody", "")
	mustKind(t, err, ErrUnknownHolder)
	bd := mustBind(t, h.g, hostA, "kv")
	if bd.Authority() != hostA || bd.Holder() != "kv" || bd.Role() != "test" {
		t.Fatalf("binding %s %s %s", bd.Authority(), bd.Holder(), bd.Role())
	}
	_, err = bd.Reserve(context.Background(), 0, 0, time.Time{})
	mustKind(t, err, memapi.ErrInvalidSize)
	_, err = bd.Reserve(context.Background(), 10, 0, h.clock.Now())
	mustKind(t, err, ErrExpired)
	mustKind(t, bd.ReserveInto(context.Background(), nil, 10, 0, time.Time{}), memapi.ErrNilHandle)
	h.g.Close()
	_, err = h.g.Bind(hostA, "kv", "")
	mustKind(t, err, memapi.ErrClosed)
	_, err = bd.Reserve(context.Background(), 10, 0, time.Time{})
	mustKind(t, err, memapi.ErrClosed)
}

// A binding is the same reservation as Governor.Reserve: same figures, same
// limit, same holder and role on the grant.
func TestBindingReserveIsReserve(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 500}})
	bd := mustBind(t, h.g, hostA, "kv")
	gr, err := bd.Reserve(context.Background(), 300, 7, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if gr.Holder() != "kv" || gr.Role() != "test" || gr.Priority() != 7 || gr.Size() != 300 || gr.Authority() != hostA {
		t.Fatalf("grant %s %s %d %d %s", gr.Holder(), gr.Role(), gr.Priority(), gr.Size(), gr.Authority())
	}
	h.wantLedger(hostA, ledger{Reserved: 300, Free: 700})
	_, err = bd.Reserve(context.Background(), 201, 0, time.Time{})
	mustKind(t, err, ErrOverLimit)
	h.wantLedger(hostA, ledger{Reserved: 300, Free: 700})
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
}

// A binding follows its names: a holder unregistered and registered again,
// an authority removed and added again, are resolved anew.
func TestBindingFollowsItsNames(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	bd := mustBind(t, h.g, hostA, "kv")
	var gr Grant
	cycle(t, bd, &gr, 100)

	if err := h.g.Unregister("kv"); err != nil {
		t.Fatal(err)
	}
	_, err := bd.Reserve(context.Background(), 10, 0, time.Time{})
	mustKind(t, err, ErrUnknownHolder)
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 50}})
	_, err = bd.Reserve(context.Background(), 60, 0, time.Time{})
	mustKind(t, err, ErrOverLimit) // the new registration's limit
	cycle(t, bd, &gr, 50)

	if err := h.g.RemoveAuthority(hostA); err != nil {
		t.Fatal(err)
	}
	_, err = bd.Reserve(context.Background(), 10, 0, time.Time{})
	mustKind(t, err, ErrUnknownAuthority)
	if err := h.g.AddAuthority(hostA, 40); err != nil {
		t.Fatal(err)
	}
	_, err = bd.Reserve(context.Background(), 41, 0, time.Time{})
	mustKind(t, err, memapi.ErrOverBudget) // the new authority's capacity
	// gr belongs to the removed authority: the new one refuses it.
	mustKind(t, bd.ReserveInto(context.Background(), &gr, 10, 0, time.Time{}), memapi.ErrAuthorityMismatch)
	var fresh Grant
	cycle(t, bd, &fresh, 40)
	h.wantLedger(hostA, ledger{Free: 40})
}

// The reuse cycle allocates nothing and leaves the ledger as it found it,
// every grant made counted.
func TestReserveIntoCycleAllocatesNothing(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	bd := mustBind(t, h.g, hostA, "kv")
	var gr Grant
	cycle(t, bd, &gr, 100) // the first issue sets the grant up
	// Past genMax reissues without the lock, one takes it and books them.
	n := testing.AllocsPerRun(2*genMax, func() { cycle(t, bd, &gr, 100) })
	if n != 0 && !raceEnabled { // the race detector's instrumentation allocates
		t.Fatalf("%v allocations per reuse cycle", n)
	}
	s := h.auth(hostA)
	if s.Free != 1000 || s.Grants != 0 || s.Leases != 0 || s.Granted != 2*genMax+2 {
		t.Fatalf("after the cycles: %+v", s)
	}
}

func TestReserveIntoRefusesAGrantInUse(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000, hostB: 1000})
	h.register("kv", nil, HolderOptions{})
	bd := mustBind(t, h.g, hostA, "kv")
	ctx := context.Background()
	var gr Grant
	if err := bd.ReserveInto(ctx, &gr, 100, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	refused := func(kind error) {
		t.Helper()
		before := h.ledger(hostA)
		mustKind(t, bd.ReserveInto(ctx, &gr, 10, 0, time.Time{}), kind)
		if after := h.ledger(hostA); after != before {
			t.Fatalf("a refused ReserveInto moved the ledger: %+v -> %+v", before, after)
		}
	}
	refused(memapi.ErrInUse) // open
	if gr.Size() != 100 || !gr.Open() {
		t.Fatalf("the refusal changed the grant: size %d open %v", gr.Size(), gr.Open())
	}
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	refused(memapi.ErrInUse) // its lease holds bytes
	if err := l.MarkPending(100); err != nil {
		t.Fatal(err)
	}
	refused(memapi.ErrInUse) // pending bytes are still held
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	mustKind(t, mustBind(t, h.g, hostB, "kv").ReserveInto(ctx, &gr, 10, 0, time.Time{}), memapi.ErrAuthorityMismatch)
	if err := bd.ReserveInto(ctx, &gr, 10, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if gr.Size() != 10 || gr.Drawn() != 0 || !gr.Open() {
		t.Fatalf("reissued grant: size %d drawn %d open %v", gr.Size(), gr.Drawn(), gr.Open())
	}
	// The old lease pointer is the new issue's lease: empty until committed.
	if l.Bytes() != 0 {
		t.Fatalf("lease of the new issue holds %d", l.Bytes())
	}
	h.wantLedger(hostA, ledger{Reserved: 10, Free: 990})

	// Expired with bytes drawn: in use until they are undrawn.
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := bd.ReserveInto(ctx, &gr, 50, 0, h.clock.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(20); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(time.Second)
	refused(memapi.ErrInUse)
	if err := gr.Undraw(20); err != nil {
		t.Fatal(err)
	}
	if err := bd.ReserveInto(ctx, &gr, 30, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
}

// While a ReserveInto waits, its grant is closed to every use and to a
// second ReserveInto; a wait that ends leaves it closed and reusable.
func TestReserveIntoWaitHoldsTheGrant(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("kv", nil, HolderOptions{})
	bd := mustBind(t, h.g, hostA, "kv")
	full := h.lease(hostA, "kv", 100)

	var gr Grant
	reserveInto := func(ctx context.Context) <-chan error {
		ch := make(chan error, 1)
		go func() { ch <- bd.ReserveInto(ctx, &gr, 60, 0, time.Time{}) }()
		return ch
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := reserveInto(ctx)
	h.awaitWaiting("kv")
	mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
	mustKind(t, gr.Undraw(0), memapi.ErrGrantClosed)
	mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
	_, err := gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, bd.ReserveInto(context.Background(), &gr, 10, 0, time.Time{}), memapi.ErrInUse)
	cancel()
	err = watchdog.Recv(t, watchdog.Bound, "the cancelled ReserveInto", done)
	mustKind(t, err, context.Canceled)
	if gr.Open() {
		t.Fatal("a failed ReserveInto left the grant open")
	}
	h.wantLedger(hostA, ledger{Charged: 100})

	// Reused after the failure, it waits again and is served by a refund.
	done = reserveInto(context.Background())
	h.awaitWaiting("kv")
	if err := full.Refund(100); err != nil {
		t.Fatal(err)
	}
	err = watchdog.Recv(t, watchdog.Bound, "the served ReserveInto", done)
	if err != nil {
		t.Fatal(err)
	}
	if !gr.Open() || gr.Size() != 60 || gr.Remaining() != 60 {
		t.Fatalf("served grant: open %v size %d remaining %d", gr.Open(), gr.Size(), gr.Remaining())
	}
	h.wantLedger(hostA, ledger{Reserved: 60, Free: 40})
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
}

// A deadline timer that fires after its grant was closed and issued again
// leaves the new issue alone.
func TestStaleDeadlineTimerSparesTheReissuedGrant(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	bd := mustBind(t, h.g, hostA, "kv")
	var gr Grant
	if err := bd.ReserveInto(context.Background(), &gr, 100, 0, h.clock.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	old := gr.dl
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := bd.ReserveInto(context.Background(), &gr, 200, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	gr.expireBy(h.g.authority(hostA), old) // what the old timer does if it fired as Cancel stopped it
	if !gr.Open() || gr.Remaining() != 200 {
		t.Fatalf("the stale timer closed the new issue: open %v remaining %d", gr.Open(), gr.Remaining())
	}
	if s := h.auth(hostA); s.ExpiredGrants != 0 || s.Reserved != 200 {
		t.Fatalf("after the stale timer: %+v", s)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
}

func TestZeroGrantIsClosed(t *testing.T) {
	var gr Grant
	if gr.Open() || gr.Remaining() != 0 || gr.Drawn() != 0 || gr.Authority() != "" || gr.Holder() != "" {
		t.Fatal("a zero Grant looks issued")
	}
	mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
	mustKind(t, gr.Undraw(0), memapi.ErrGrantClosed)
	mustKind(t, gr.Refund(1), memapi.ErrGrantClosed)
	mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
	_, err := gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
}

// A commit of a fully drawn grant takes no lock; every reader of the figures
// it moves settles it first.
func TestUnlockedCommitIsSettledBeforeItIsRead(t *testing.T) {
	setup := func(t *testing.T) (*harness, *leaseHolder, *Lease) {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
		lh := &leaseHolder{frac: 100}
		h.register("kv", lh, HolderOptions{Priority: 1})
		h.register("w", nil, HolderOptions{Priority: 9})
		gr, err := h.g.Reserve(context.Background(), hostA, "kv", "kv", 600, 0, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if err := gr.Draw(600); err != nil {
			t.Fatal(err)
		}
		l, err := gr.Commit()
		if err != nil {
			t.Fatal(err)
		}
		a := h.g.authority(hostA)
		a.mu.Lock()
		unsettled := a.unsettledLocked(gr) && a.reserved == 600 && a.charged == 0
		a.mu.Unlock()
		if !unsettled {
			t.Fatal("the commit of a fully drawn grant was booked at once: the test no longer tests the unlocked path")
		}
		lh.add(l)
		return h, lh, l
	}
	t.Run("snapshot", func(t *testing.T) {
		h, _, _ := setup(t)
		s := h.auth(hostA)
		if s.Reserved != 0 || s.Charged != 600 || s.Grants != 0 || s.Leases != 1 || s.Reclaimable != 600 {
			t.Fatalf("snapshot %+v", s)
		}
		hs := h.g.Snapshot().Holders[0].Authorities[0]
		if hs.Charged != 600 || hs.Reserved != 0 || hs.Grants != 0 || hs.Leases != 1 {
			t.Fatalf("holder snapshot %+v", hs)
		}
	})
	t.Run("lease", func(t *testing.T) {
		h, _, l := setup(t)
		if l.Charged() != 600 || l.Bytes() != 600 {
			t.Fatalf("lease charged %d bytes %d", l.Charged(), l.Bytes())
		}
		if err := l.Refund(600); err != nil {
			t.Fatal(err)
		}
		h.wantLedger(hostA, ledger{Free: 1000})
	})
	t.Run("pressure", func(t *testing.T) {
		h, lh, _ := setup(t)
		ctx, cancel := context.WithTimeout(context.Background(), bound) // no ticket would mean no refund
		defer cancel()
		gr, err := h.g.Reserve(ctx, hostA, "w", "w", 700, 0, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if ts := lh.ticketsSeen(); len(ts) != 1 || ts[0].Wanted != 300 {
			t.Fatalf("tickets %+v, want one for 300", ts)
		}
		if err := gr.Cancel(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("over budget", func(t *testing.T) {
		h, _, _ := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := h.g.Reserve(ctx, hostA, "w", "w", 1000, 0, time.Time{})
		var ob *OverBudgetError
		if !errors.As(err, &ob) || ob.Charged != 600 || ob.Reserved != 0 {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("unregister and remove", func(t *testing.T) {
		h, _, l := setup(t)
		mustKind(t, h.g.Unregister("kv"), memapi.ErrInUse)
		mustKind(t, h.g.RemoveAuthority(hostA), memapi.ErrInUse)
		l.Release()
		if err := h.g.Unregister("kv"); err != nil {
			t.Fatal(err)
		}
	})
}

// A whole refund of a lease committed without the lock takes no lock
// either; a reservation that does not fit counts it before it waits or
// fails over its limit.
func TestUnlockedRefundIsCountedBeforeRefusing(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 100}})
	for range 3 {
		l := h.lease(hostA, "kv", 100) // committed without the lock
		if err := l.Refund(100); err != nil {
			t.Fatal(err)
		}
		a := h.g.authority(hostA)
		a.mu.Lock()
		unsettled := a.reserved == 100
		a.mu.Unlock()
		if !unsettled {
			t.Fatal("the whole refund was booked at once: the test no longer tests the unlocked path")
		}
	}
	if s := h.auth(hostA); s.Waited != 0 || s.OverBudget != 0 || s.Free != 100 || s.Granted != 3 {
		t.Fatalf("a refund not yet settled made a reservation wait or fail: %+v", s)
	}
}

// A refund without the lock while a reservation waits serves it: the
// waiter marks itself queued before it settles and the refund looks for
// waiters after its swap, so one of them sees the other.
func TestUnlockedRefundServesAWaiter(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("kv", nil, HolderOptions{})
	h.register("w", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), hostA, "kv", "", 60, 0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(60); err != nil {
		t.Fatal(err)
	}
	waiter := h.reserveAsync(context.Background(), hostA, "w", 50, 0, time.Time{})
	h.awaitWaiting("w")
	l, err := gr.Commit() // without the lock, after the waiter settled
	if err != nil {
		t.Fatal(err)
	}
	if _, st, _ := gr.load(); st != stateCommit {
		t.Fatalf("state %d: the test no longer tests the unlocked path", st)
	}
	if err := l.Refund(60); err != nil {
		t.Fatal(err)
	}
	r := await(t, waiter)
	if r.err != nil {
		t.Fatal(r.err)
	}
	h.wantLedger(hostA, ledger{Reserved: 50, Free: 50})
	if err := r.gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	mustKind(t, l.Refund(1), ErrOverReturn)
	if l.Release() != 0 {
		t.Fatal("a refunded lease released bytes")
	}
}

// Grants refunded without the lock are settled as new ones are issued, so
// the authority's list of unsettled grants stays bounded.
func TestUnsettledGrantsStayBounded(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1 << 30})
	h.register("kv", nil, HolderOptions{})
	open, err := h.g.Reserve(context.Background(), hostA, "kv", "", 10, 0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for range 5000 {
		if err := h.lease(hostA, "kv", 4096).Refund(4096); err != nil {
			t.Fatal(err)
		}
	}
	a := h.g.authority(hostA)
	a.mu.Lock()
	linked := a.linked
	a.mu.Unlock()
	if linked > 2*1+64+1 {
		t.Fatalf("%d grants left unsettled", linked)
	}
	if err := open.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1 << 30})
}

// After Close a grant open at the time still unwinds, but is not issued
// again, not even without the lock.
func TestReserveIntoAfterClose(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	bd := mustBind(t, h.g, hostA, "kv")
	var gr Grant
	if err := bd.ReserveInto(context.Background(), &gr, 100, 0, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := h.g.Close(); err != nil {
		t.Fatal(err)
	}
	cycleErr := func() error {
		if err := gr.Draw(100); err != nil {
			return err
		}
		l, err := gr.Commit()
		if err != nil {
			return err
		}
		return l.Refund(100)
	}
	if err := cycleErr(); err != nil {
		t.Fatal(err)
	}
	mustKind(t, bd.ReserveInto(context.Background(), &gr, 100, 0, time.Time{}), memapi.ErrClosed)
	h.wantLedger(hostA, ledger{Free: 1000})
}
