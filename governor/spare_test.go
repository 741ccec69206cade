package governor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

const hostB memapi.AuthorityID = "host-b"

// reserve reserves n bytes on a for holder in role "test".
func reserve(t testing.TB, g *Governor, a memapi.AuthorityID, holder HolderID, n memapi.Bytes) Grant {
	t.Helper()
	gr, err := g.Reserve(context.Background(), Request{Authority: a, Holder: holder, Role: "test", Bytes: n})
	if err != nil {
		t.Fatal(err)
	}
	return gr
}

// cycle reserves n bytes on a for holder, draws them all, commits and
// refunds: the hot path. It returns the grant, whose use then ended.
func cycle(t testing.TB, g *Governor, a memapi.AuthorityID, holder HolderID, n memapi.Bytes) Grant {
	t.Helper()
	gr := reserve(t, g, a, holder, n)
	spend(t, gr, n)
	return gr
}

// spend draws all n bytes of gr, commits and refunds them: the rest of the
// hot path, which ends gr's use.
func spend(t testing.TB, gr Grant, n memapi.Bytes) {
	t.Helper()
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

// wantSameRecord fails t unless got is an issue of want's record, the spare grant Reserve was to
// issue again. The race detector's sync.Pool drops a share of what it is
// given, so there a fresh grant is also right.
func wantSameRecord(t *testing.T, got, want Grant) {
	t.Helper()
	if got.g != want.g && !raceEnabled {
		t.Fatal("Reserve did not issue the spare grant again")
	}
}

func TestReserveErrors(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()
	_, err := h.g.Reserve(ctx, Request{Authority: "nope", Holder: "kv", Bytes: 10})
	mustKind(t, err, ErrUnknownAuthority)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "nobody", Bytes: 10})
	mustKind(t, err, ErrUnknownHolder)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv"})
	mustKind(t, err, memapi.ErrInvalidSize)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10, Deadline: h.clock.Now()})
	mustKind(t, err, ErrExpired)
	// Neither refusal took or dropped a spare grant's bytes.
	cycle(t, h.g, hostA, "kv", 10)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "nobody", Bytes: 10})
	mustKind(t, err, ErrUnknownHolder)
	h.wantLedger(hostA, ledger{Free: 1000})
	h.g.Close()
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
	mustKind(t, err, memapi.ErrClosed)
}

// A spare grant issued again carries the new request: holder, role,
// priority, size, and the new holder's limit.
func TestSpareGrantCarriesTheNewRequest(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	h.register("w", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 500}})
	old := cycle(t, h.g, hostA, "kv", 100)
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "w", Role: "pages", Bytes: 300, Priority: 7})
	if err != nil {
		t.Fatal(err)
	}
	wantSameRecord(t, gr, old)
	if gr.Holder() != "w" || gr.Role() != "pages" || gr.Priority() != 7 || gr.Size() != 300 || gr.Authority() != hostA || gr.Drawn() != 0 || !gr.Open() {
		t.Fatalf("grant %s %s %d %d %s drawn %d", gr.Holder(), gr.Role(), gr.Priority(), gr.Size(), gr.Authority(), gr.Drawn())
	}
	h.wantLedger(hostA, ledger{Reserved: 300, Free: 700})
	_, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "w", Bytes: 201})
	mustKind(t, err, ErrOverLimit)
	h.wantLedger(hostA, ledger{Reserved: 300, Free: 700})
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
	if s := h.auth(hostA); s.Granted != 2 || s.Grants != 0 || s.Leases != 0 {
		t.Fatalf("after the reissue: %+v", s)
	}
}

// Spare grants follow their names: after a holder is unregistered and
// registered again, or an authority removed and added again, a spare grant
// of the old one is not issued again without the lock.
func TestSpareGrantFollowsItsNames(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()
	cycle(t, h.g, hostA, "kv", 100)

	if err := h.g.Unregister("kv"); err != nil {
		t.Fatal(err)
	}
	_, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
	mustKind(t, err, ErrUnknownHolder)
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 50}})
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 60})
	mustKind(t, err, ErrOverLimit) // the new registration's limit
	cycle(t, h.g, hostA, "kv", 50)
	if s := h.g.Snapshot().Holders[0].Authorities[0]; s.Reserved != 0 || s.Charged != 0 || s.Grants != 0 {
		t.Fatalf("the new registration's account: %+v", s)
	}

	if err := h.g.RemoveAuthority(hostA); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
	mustKind(t, err, ErrUnknownAuthority)
	if err := h.g.AddAuthority(hostA, 40); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 41})
	mustKind(t, err, memapi.ErrOverBudget) // the new authority's capacity
	cycle(t, h.g, hostA, "kv", 40)
	h.wantLedger(hostA, ledger{Free: 40})
}

// The reservation cycle allocates nothing and leaves the ledger as it found
// it, every grant made counted.
func TestReserveCycleAllocatesNothing(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	cycle(t, h.g, hostA, "kv", 100) // the first issue sets the grant up
	// Past genMax reissues without the lock, one takes it and books them.
	n := testing.AllocsPerRun(2*genMax, func() { cycle(t, h.g, hostA, "kv", 100) })
	if n != 0 && !raceEnabled { // the race detector's instrumentation allocates
		t.Fatalf("%v allocations per reservation cycle", n)
	}
	// (AllocsPerRun changes GOMAXPROCS, which empties a sync.Pool: its
	// first run allocated a grant, which every later one reissued.)
	first := cycle(t, h.g, hostA, "kv", 100)
	wantSameRecord(t, cycle(t, h.g, hostA, "kv", 100), first)
	s := h.auth(hostA)
	if s.Free != 1000 || s.Grants != 0 || s.Leases != 0 || s.Granted != 2*genMax+4 {
		t.Fatalf("after the cycles: %+v", s)
	}
}

// A grant is issued again only once its use ended: never while it is open,
// its lease holds bytes (charged or pending), or it expired with bytes
// drawn. Until it is issued again, the old grant and lease refuse every
// use.
func TestSpareGrantOnlyOnceItsUseEnded(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000, hostB: 1000})
	h.register("kv", nil, HolderOptions{})
	gr := reserve(t, h.g, hostA, "kv", 100)
	other := func() {
		t.Helper()
		before := h.ledger(hostA)
		x := reserve(t, h.g, hostA, "kv", 10)
		if x.g == gr.g {
			t.Fatal("a grant in use was issued again")
		}
		if err := x.Cancel(); err != nil {
			t.Fatal(err)
		}
		if after := h.ledger(hostA); after != before {
			t.Fatalf("a reservation moved the grant in use: %+v -> %+v", before, after)
		}
	}
	other() // open
	if gr.Size() != 100 || !gr.Open() {
		t.Fatalf("the reservation changed the grant: size %d open %v", gr.Size(), gr.Open())
	}
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	other() // its lease holds bytes
	if err := l.MarkPending(100); err != nil {
		t.Fatal(err)
	}
	other() // pending bytes are still held
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})

	// A whole refund ends the use: until it is issued again the old grant
	// and lease refuse every use, and another authority never takes it.
	gr = cycle(t, h.g, hostA, "kv", 100)
	l = Lease(gr)
	mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
	_, err = gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
	mustKind(t, l.Refund(1), ErrOverReturn)
	if x := reserve(t, h.g, hostB, "kv", 10); x.g == gr.g {
		t.Fatal("another authority issued the spare grant")
	} else if err := x.Cancel(); err != nil {
		t.Fatal(err)
	}
	x := reserve(t, h.g, hostA, "kv", 10)
	wantSameRecord(t, x, gr)
	if x.Size() != 10 || x.Drawn() != 0 || !x.Open() {
		t.Fatalf("reissued grant: size %d drawn %d open %v", x.Size(), x.Drawn(), x.Open())
	}
	// The old lease is stale (when the race detector's sync.Pool kept the
	// record): it reads empty and refuses every use.
	if x.g == gr.g {
		mustStale(t, l.Refund(1))
	}
	if l.Bytes() != 0 {
		t.Fatalf("lease of the new issue holds %d", l.Bytes())
	}
	h.wantLedger(hostA, ledger{Reserved: 10, Free: 990})
	if err := x.Cancel(); err != nil {
		t.Fatal(err)
	}

	// Expired with bytes drawn: in use until they are undrawn, and never
	// spare (only a cancel or a whole refund ends a grant's use).
	gr, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Bytes: 50, Deadline: h.clock.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(20); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(time.Second)
	other()
	if err := gr.Undraw(20); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
}

// A reservation that waits holds no grant: a spare one stays closed to
// every use of its old issue, and is not issued again (its handles are not
// stale) until a reservation is served; a wait that ends leaves it spare.
func TestSpareGrantWhileAReservationWaits(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 160})
	h.register("kv", nil, HolderOptions{})
	full := h.lease(hostA, "kv", 100)
	gr := cycle(t, h.g, hostA, "kv", 60) // spare

	ctx, cancel := context.WithCancel(context.Background())
	done := h.reserveAsync(ctx, hostA, "kv", 61, 0, time.Time{})
	h.awaitWaiting("kv")
	mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
	mustKind(t, gr.Undraw(0), memapi.ErrGrantClosed)
	mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
	_, err := gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
	if err := gr.Cancel(); errors.Is(err, ErrStaleHandle) {
		t.Fatalf("the waiting reservation issued the spare grant again: %v", err)
	}
	cancel()
	r := await(t, done)
	mustKind(t, r.err, context.Canceled)
	if gr.Open() {
		t.Fatal("a failed reservation left the spare grant open")
	}
	h.wantLedger(hostA, ledger{Charged: 100, Free: 60})

	// Spare after the failure, a reservation waits again and is served
	// by a refund, in the spare record: the old handles are stale now.
	done = h.reserveAsync(context.Background(), hostA, "kv", 61, 0, time.Time{})
	h.awaitWaiting("kv")
	if err := full.Refund(100); err != nil {
		t.Fatal(err)
	}
	r = await(t, done)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.gr.Open() || r.gr.Size() != 61 || r.gr.Remaining() != 61 {
		t.Fatalf("served grant: open %v size %d remaining %d", r.gr.Open(), r.gr.Size(), r.gr.Remaining())
	}
	h.wantLedger(hostA, ledger{Reserved: 61, Free: 99})
	// Served in a spare record, the last one retired first: full's, whose
	// refund served it; gr's handles are closed but not stale yet.
	if r.gr.g != full.g {
		t.Fatal("the served reservation did not take the spare record its refund retired")
	}
	mustStale(t, Lease(full).Refund(1))
	if err := gr.Cancel(); errors.Is(err, ErrStaleHandle) || !errors.Is(err, memapi.ErrGrantClosed) {
		t.Fatalf("the spare grant's old handle: %v", err)
	}
	if err := r.gr.Cancel(); err != nil {
		t.Fatal(err)
	}
}

// A deadline timer that fires after its grant was closed and issued again
// leaves the new issue alone.
func TestStaleDeadlineTimerSparesTheReissuedGrant(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Bytes: 100, Deadline: h.clock.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	old := gr.g.dl.Load()
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	x := reserve(t, h.g, hostA, "kv", 200)
	if x.g != gr.g {
		if raceEnabled {
			t.Skip("the race detector's sync.Pool dropped the spare grant")
		}
		t.Fatal("Reserve did not issue the spare grant again")
	}
	gr.g.expireBy(h.g.authority(hostA), old) // what the old timer does if it fired as Cancel stopped it
	if !x.Open() || x.Remaining() != 200 {
		t.Fatalf("the stale timer closed the new issue: open %v remaining %d", x.Open(), x.Remaining())
	}
	if s := h.auth(hostA); s.ExpiredGrants != 0 || s.Reserved != 200 {
		t.Fatalf("after the stale timer: %+v", s)
	}
	if err := x.Cancel(); err != nil {
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
	setup := func(t *testing.T) (*harness, *leaseHolder, Lease) {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
		lh := &leaseHolder{frac: 100}
		h.register("kv", lh, HolderOptions{Priority: 1})
		h.register("w", nil, HolderOptions{Priority: 9})
		gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 600})
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
		unsettled := a.unsettledLocked(gr.g) && a.reserved == 600 && a.charged == 0
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
		gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "w", Role: "w", Bytes: 700})
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
		_, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "w", Role: "w", Bytes: 1000})
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
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "", Bytes: 60})
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
	// The waiter was served in the record the refund retired: the old
	// lease is stale.
	if r.gr.g != gr.g {
		t.Fatal("the waiter was not served in the record the refund retired")
	}
	mustStale(t, l.Refund(1))
	if l.Release() != 0 {
		t.Fatal("a refunded lease released bytes")
	}
}

// Grants refunded without the lock are settled as new ones are issued, so
// the authority's list of unsettled grants stays bounded.
func TestUnsettledGrantsStayBounded(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1 << 30})
	h.register("kv", nil, HolderOptions{})
	open, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "", Bytes: 10})
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
func TestSpareGrantAfterClose(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	gr := reserve(t, h.g, hostA, "kv", 100)
	if err := h.g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "test", Bytes: 100})
	mustKind(t, err, memapi.ErrClosed)
	h.wantLedger(hostA, ledger{Free: 1000})
}
