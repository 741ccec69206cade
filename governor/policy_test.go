package governor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

// The asking policy, each rule alone: which bytes count against a limit,
// what is asked, of whom first, and what serves the queue. A rule broken
// here shows as a wrong answer at once; where a broken rule would make a
// reservation wait instead, its context is cut at unbounded (real time),
// so the failure is a wrong error, not a hang.

// unbounded is far longer than any step of these tests takes: only a
// broken rule lets a reservation reach it.
const unbounded = 10 * time.Second

// TestWaitingBytesCountAgainstTheLimit: a holder's queued reservations
// count against its limit, like its charged bytes, so a second
// reservation beyond the limit fails at once instead of queueing behind
// the first.
func TestWaitingBytesCountAgainstTheLimit(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("other", nil, HolderOptions{})
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 500}})
	full := h.lease(hostA, "other", 1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := h.reserveAsync(ctx, hostA, "kv", 300, 0, time.Time{})
	h.awaitWaiting("kv")

	cut, stop := context.WithTimeout(context.Background(), unbounded)
	defer stop()
	_, err := h.g.Reserve(cut, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 300})
	mustKind(t, err, errOverLimit)
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.HolderUse != 300 || ob.Limit != 500 {
		t.Fatalf("want the 300 bytes queued counted as the holder's use: %v", err)
	}
	cancel()
	if r := await(t, first); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the queued reservation: %v", r.err)
	}
	full.release()
	h.wantLedger(hostA, ledger{Free: 1000})
}

// blockingHolder answers its first ticket only when let go (or its
// context ends), every later one at once; it frees nothing.
type blockingHolder struct {
	entered, letGo chan struct{}
	mu             sync.Mutex
	tickets        []Ticket
}

func (b *blockingHolder) Reclaim(ctx context.Context, t Ticket) (memapi.Bytes, error) {
	b.mu.Lock()
	b.tickets = append(b.tickets, t)
	first := len(b.tickets) == 1
	b.mu.Unlock()
	if first {
		close(b.entered)
		select {
		case <-b.letGo:
		case <-ctx.Done():
		}
	}
	return 0, nil
}

func (b *blockingHolder) seen() []Ticket {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Ticket(nil), b.tickets...)
}

// TestBytesAskedAreNotAskedTwice: the bytes a ticket in flight asks for
// are counted on their way, so a reservation queued behind it asks only
// for its own shortfall, not again for what the first is asking.
func TestBytesAskedAreNotAskedTwice(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	holder := &blockingHolder{entered: make(chan struct{}), letGo: make(chan struct{})}
	h.register("h", holder, HolderOptions{})
	h.register("a", nil, HolderOptions{})
	h.register("b", nil, HolderOptions{})
	l := h.lease(hostA, "h", 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := h.reserveAsync(ctx, hostA, "a", 10, 0, time.Time{})
	watchdog.Recv(t, bound, "the first ticket", holder.entered)
	second := h.reserveAsync(ctx, hostA, "b", 10, 0, time.Time{})
	h.awaitWaiting("b")
	tk := holder.seen()
	if len(tk) != 2 || tk[0].Wanted != 10 || tk[1].Wanted != 10 {
		t.Fatalf("tickets %+v: want 10 bytes each (the second queued behind 10 already asked)", tk)
	}
	close(holder.letGo)
	cancel()
	for _, ch := range []<-chan result{first, second} {
		if r := await(t, ch); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("a reservation: %v", r.err)
		}
	}
	if s := h.auth(hostA); s.Asking != 0 {
		t.Fatalf("asks left booked: %+v", s)
	}
	l.release()
}

// TestMostReclaimableAskedFirst: among holders of one priority (no cache
// among them) the one with the most bytes over its guarantee is asked
// first, whatever the order of their names.
func TestMostReclaimableAskedFirst(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	small, large := &leaseHolder{frac: 100}, &leaseHolder{frac: 100}
	h.register("a-small", small, HolderOptions{})
	h.register("b-large", large, HolderOptions{})
	h.register("req", nil, HolderOptions{})
	small.add(h.lease(hostA, "a-small", 100))
	large.add(h.lease(hostA, "b-large", 400))
	// free 500; a reservation of 600 lacks 100, which either could give.
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "test", Bytes: 600})
	if err != nil {
		t.Fatal(err)
	}
	if tk := large.ticketsSeen(); len(tk) != 1 || tk[0].Wanted != 100 {
		t.Fatalf("the holder with 400 bytes was asked %+v, want one ticket of 100", tk)
	}
	if tk := small.ticketsSeen(); len(tk) != 0 {
		t.Fatalf("the holder with 100 bytes was asked first: %+v", tk)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
}

// TestQuarantinedBytesAreNeverAskedFor: a holder cannot free bytes whose
// free failed (they wait for a retry), so they are not reclaimable and the
// holder is not asked for them; nor do they count towards what it holds
// beyond its guarantee (400 charged, 300 of them quarantined, a guarantee
// of 200: nothing to ask for).
func TestQuarantinedBytesAreNeverAskedFor(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	stuck, able := &leaseHolder{frac: 100}, &leaseHolder{frac: 100}
	h.register("stuck", stuck, HolderOptions{Guarantee: map[memapi.AuthorityID]memapi.Bytes{hostA: 200}})
	h.register("able", able, HolderOptions{})
	h.register("req", nil, HolderOptions{})
	q := h.lease(hostA, "stuck", 400)
	if err := q.MarkPending(300); err != nil {
		t.Fatal(err)
	}
	if err := q.Quarantine(300); err != nil {
		t.Fatal(err)
	}
	able.add(h.lease(hostA, "able", 300))
	if s := h.auth(hostA); s.Reclaimable != 300 {
		t.Fatalf("reclaimable %d, want the other holder's 300 alone", s.Reclaimable)
	}
	// free 300; a reservation of 500 lacks 200.
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "test", Bytes: 500})
	if err != nil {
		t.Fatal(err)
	}
	if tk := stuck.ticketsSeen(); len(tk) != 0 {
		t.Fatalf("the holder whose bytes are all quarantined was asked: %+v", tk)
	}
	if tk := able.ticketsSeen(); len(tk) != 1 || tk[0].Wanted != 200 {
		t.Fatalf("tickets %+v, want one of 200", tk)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := q.QuarantinedAccount().Refund(300); err != nil {
		t.Fatal(err)
	}
	q.release()
}

// TestCommitOfLessThanTheGrantServesTheQueue: a grant committed with less
// drawn than it holds returns the rest to free, and a reservation waiting
// for those bytes is served then.
func TestCommitOfLessThanTheGrantServesTheQueue(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("a", nil, HolderOptions{})
	h.register("b", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "a", Role: "test", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	cut, stop := context.WithTimeout(context.Background(), unbounded)
	defer stop()
	waiting := h.reserveAsync(cut, hostA, "b", 50, 0, time.Time{})
	h.awaitWaiting("b")
	if err := gr.Draw(40); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	r := await(t, waiting)
	if r.err != nil {
		t.Fatalf("the reservation waiting for the 60 bytes the commit returned: %v", r.err)
	}
	h.wantLedger(hostA, ledger{Reserved: 50, Charged: 40, Free: 10})
	if err := r.gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	l.release()
}
