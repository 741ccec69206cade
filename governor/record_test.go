package governor

import (
	"context"
	"sync"
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
// refunds. It returns the grant, whose use then ended.
func cycle(t testing.TB, g *Governor, a memapi.AuthorityID, holder HolderID, n memapi.Bytes) Grant {
	t.Helper()
	gr := reserve(t, g, a, holder, n)
	spend(t, gr, n)
	return gr
}

// spend draws all n bytes of gr, commits and refunds them.
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

// isOpen reports whether gr can still be drawn from: open, and its deadline
// (if any) not passed on its governor's clock.
func isOpen(gr Grant) bool {
	if gr.g == nil {
		return false
	}
	var st grantState
	gr.read(func(r *grant) { st = r.state })
	return st == stateOpen && (gr.g.dl == nil || gr.g.a.g.clock.Now().Before(gr.g.dl.at))
}

func TestReserveErrors(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()
	_, err := h.g.Reserve(ctx, Request{Authority: "nope", Holder: "kv", Bytes: 10})
	mustKind(t, err, errUnknownAuthority)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "nobody", Bytes: 10})
	mustKind(t, err, errUnknownHolder)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv"})
	mustKind(t, err, memapi.ErrInvalidSize)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: maxBytes + 1})
	mustKind(t, err, memapi.ErrInvalidSize)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10, Deadline: h.clock.Now()})
	mustKind(t, err, context.DeadlineExceeded)
	h.wantLedger(hostA, ledger{Free: 1000})
	if s := h.auth(hostA); s.Granted != 0 || s.Grants != 0 {
		t.Fatalf("refusals counted as grants: %+v", s)
	}
	h.g.Close()
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
	mustKind(t, err, memapi.ErrClosed)
}

func TestZeroGrantIsClosed(t *testing.T) {
	var gr Grant
	if isOpen(gr) || gr.remaining() != 0 || gr.drawnNow() != 0 || gr.Authority() != "" || gr.holder() != "" || gr.Size() != 0 {
		t.Fatal("a zero Grant looks issued")
	}
	mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
	mustKind(t, gr.Undraw(0), memapi.ErrGrantClosed)
	mustKind(t, gr.Refund(1), memapi.ErrGrantClosed)
	mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
	_, err := gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
}

// Every Reserve makes a new record, so the handles of a grant whose use
// ended refuse every use for ever, whatever was reserved since, and never
// touch another reservation.
func TestEndedHandlesAreRefusedForEver(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	h.register("w", nil, HolderOptions{})
	cancelled := reserve(t, h.g, hostA, "kv", 100)
	if err := cancelled.Cancel(); err != nil {
		t.Fatal(err)
	}
	spent := cycle(t, h.g, hostA, "kv", 100)
	emptied := Lease(spent)
	// Later reservations of the same size, by the same holder and another.
	same := reserve(t, h.g, hostA, "kv", 100)
	other := reserve(t, h.g, hostA, "w", 100)
	if same.g == cancelled.g || same.g == spent.g || other.g == cancelled.g || other.g == spent.g {
		t.Fatal("a record was issued twice")
	}
	for _, old := range []Grant{cancelled, spent} {
		mustKind(t, old.Draw(1), memapi.ErrGrantClosed)
		mustKind(t, old.Undraw(1), memapi.ErrGrantClosed)
		_, err := old.Commit()
		mustKind(t, err, memapi.ErrGrantClosed)
		if old.remaining() != 0 || old.drawnNow() != 0 {
			t.Fatalf("an ended grant reads remaining %d drawn %d", old.remaining(), old.drawnNow())
		}
	}
	if err := cancelled.Cancel(); err != nil {
		t.Fatalf("a second cancel: %v", err)
	}
	mustKind(t, spent.Cancel(), memapi.ErrGrantClosed)
	mustKind(t, emptied.Refund(1), errOverReturn)
	mustKind(t, emptied.MarkPending(1), errOverReturn)
	mustKind(t, emptied.Quarantine(1), errOverReturn)
	mustKind(t, emptied.refundQuarantined(1), errOverReturn)
	mustKind(t, Lease(cancelled).Refund(1), memapi.ErrGrantClosed)
	if n := emptied.release(); n != 0 || emptied.Bytes() != 0 {
		t.Fatalf("an emptied lease released %d, holds %d", n, emptied.Bytes())
	}
	if same.remaining() != 100 || other.remaining() != 100 || same.holder() != "kv" || other.holder() != "w" {
		t.Fatalf("the old handles touched the new grants: %d %d", same.remaining(), other.remaining())
	}
	h.wantLedger(hostA, ledger{Reserved: 200, Free: 800})
	if s := h.auth(hostA); s.Granted != 4 || s.Grants != 2 || s.Leases != 0 {
		t.Fatalf("counts: %+v", s)
	}
}

// blockingClock is a fakeClock whose Now blocks once, when armed, until
// released: the window between a method's start and its change of the
// record.
type blockingClock struct {
	*fakeClock
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (c *blockingClock) Now() time.Time {
	c.mu.Lock()
	armed := c.armed
	c.armed = false
	c.mu.Unlock()
	if armed {
		close(c.entered)
		<-c.release
	}
	return c.fakeClock.Now()
}

// A Draw delayed between its start and its change (here in the clock's Now,
// which a grant with a deadline consults) while the owner cancels the grant
// and another holder reserves the same bytes with a deadline of its own
// lands on nothing: it fails with memapi.ErrGrantClosed and the other
// holder's grant is untouched. (With the recycled records of the earlier
// design, the delayed compare-and-swap found the other holder's issue in
// the same word, bit for bit, and drew 10 bytes from it.)
func TestDelayedDrawDoesNotLandOnTheNextHoldersGrant(t *testing.T) {
	clock := &blockingClock{fakeClock: newFakeClock(), entered: make(chan struct{}), release: make(chan struct{})}
	g := New(Options{Clock: clock})
	t.Cleanup(func() { g.Close() })
	if err := g.AddAuthority(hostA, 1000); err != nil {
		t.Fatal(err)
	}
	for _, id := range []HolderID{"a", "b"} {
		if err := g.Register(id, nil, HolderOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	deadline := clock.Now().Add(time.Hour)
	mine, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "a", Bytes: 100, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	clock.mu.Lock()
	clock.armed = true
	clock.mu.Unlock()
	drew := make(chan error, 1)
	go func() { drew <- mine.Draw(10) }()
	<-clock.entered
	// The owner cancels and another holder reserves the same size, with
	// a deadline, while the Draw is held.
	if err := mine.Cancel(); err != nil {
		t.Fatal(err)
	}
	theirs, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "b", Bytes: 100, Deadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	close(clock.release)
	mustKind(t, <-drew, memapi.ErrGrantClosed)
	if theirs.drawnNow() != 0 || theirs.remaining() != 100 {
		t.Fatalf("the delayed Draw drew from the other holder's grant: drawn %d remaining %d", theirs.drawnNow(), theirs.remaining())
	}
	s, _ := g.Authority(hostA)
	if s.Reserved != 100 || s.Drawn != 0 || s.Free != 900 {
		t.Fatalf("ledger: %+v", s)
	}
	if err := theirs.Cancel(); err != nil {
		t.Fatal(err)
	}
}

// A holder registered again and an authority added again start with fresh
// accounts: the new limit and capacity hold.
func TestNamesComeBackFresh(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()
	cycle(t, h.g, hostA, "kv", 100)
	if err := h.g.Unregister("kv"); err != nil {
		t.Fatal(err)
	}
	_, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
	mustKind(t, err, errUnknownHolder)
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 50}})
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 60})
	mustKind(t, err, errOverLimit)
	cycle(t, h.g, hostA, "kv", 50)
	if err := h.g.RemoveAuthority(hostA); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
	mustKind(t, err, errUnknownAuthority)
	if err := h.g.AddAuthority(hostA, 40); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 41})
	mustKind(t, err, memapi.ErrOverBudget)
	cycle(t, h.g, hostA, "kv", 40)
	h.wantLedger(hostA, ledger{Free: 40})
}

// A deadline timer that fires after its grant was cancelled (it was due as
// Cancel stopped it) changes nothing.
func TestLateDeadlineTimerChangesNothing(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Bytes: 100, Deadline: h.clock.Now().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	x := reserve(t, h.g, hostA, "kv", 200)
	gr.g.expire() // what the timer does if it fired as Cancel stopped it
	if !isOpen(x) || x.remaining() != 200 {
		t.Fatalf("the late timer closed another grant: remaining %d", x.remaining())
	}
	if s := h.auth(hostA); s.ExpiredGrants != 0 || s.Reserved != 200 || len(h.eventsOf(EventGrantExpired)) != 0 {
		t.Fatalf("after the late timer: %+v", s)
	}
	if err := x.Cancel(); err != nil {
		t.Fatal(err)
	}
}
