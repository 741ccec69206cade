package governor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

// bound is how long a test waits for something that must happen; it guards
// against a deadlock hanging the suite, it does not time anything.
const bound = watchdog.Bound

type harness struct {
	t       testing.TB
	g       *Governor
	clock   *fakeClock
	waiting chan Event

	mu     sync.Mutex
	events []Event
}

func newHarness(t testing.TB, caps map[memapi.AuthorityID]memapi.Bytes) *harness {
	t.Helper()
	h := &harness{t: t, clock: newFakeClock(), waiting: make(chan Event, 64)}
	h.g = New(Options{Clock: h.clock, OnEvent: h.record})
	for id, c := range caps {
		if err := h.g.AddAuthority(id, c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { watchdog.Within(t, bound, "Governor.Close", func() { h.g.Close() }) })
	return h
}

func (h *harness) record(e Event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
	if e.Kind == EventWaiting {
		h.waiting <- e
	}
}

func (h *harness) eventsOf(kind string) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Event
	for _, e := range h.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// awaitWaiting blocks until a reservation by holder is queued and its
// tickets have run.
func (h *harness) awaitWaiting(holder HolderID) Event {
	h.t.Helper()
	e := watchdog.Recv(h.t, bound, "the reservation of "+string(holder)+" starting to wait", h.waiting)
	if e.Holder != holder {
		h.t.Fatalf("waiting event for %s, want %s", e.Holder, holder)
	}
	return e
}

func (h *harness) register(id HolderID, rec Holder, opts HolderOptions) {
	h.t.Helper()
	if err := h.g.Register(id, rec, opts); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) auth(id memapi.AuthorityID) AuthoritySnapshot {
	h.t.Helper()
	s, ok := h.g.Authority(id)
	if !ok {
		h.t.Fatalf("authority %s missing", id)
	}
	if !s.Balanced() {
		h.t.Fatalf("authority %s unbalanced: %+v", id, s)
	}
	return s
}

// ledger is the four figures of an authority, for compact comparisons.
type ledger struct{ Reserved, Charged, Pending, Free memapi.Bytes }

func (h *harness) ledger(id memapi.AuthorityID) ledger {
	h.t.Helper()
	s := h.auth(id)
	return ledger{s.Reserved, s.Charged, s.Pending, s.Free}
}

func (h *harness) wantLedger(id memapi.AuthorityID, want ledger) {
	h.t.Helper()
	if got := h.ledger(id); got != want {
		h.t.Fatalf("ledger of %s = %+v, want %+v", id, got, want)
	}
}

// lease reserves, draws and commits n bytes for holder.
func (h *harness) lease(auth memapi.AuthorityID, holder HolderID, n memapi.Bytes) Lease {
	h.t.Helper()
	gr, err := h.g.Reserve(context.Background(), Request{Authority: auth, Holder: holder, Role: "test", Bytes: n})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := gr.Draw(n); err != nil {
		h.t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		h.t.Fatal(err)
	}
	return l
}

type result struct {
	gr  Grant
	err error
}

// reserveAsync runs Reserve in a goroutine; the result arrives on the channel.
func (h *harness) reserveAsync(ctx context.Context, auth memapi.AuthorityID, holder HolderID, n memapi.Bytes, pri int, deadline time.Time) <-chan result {
	ch := make(chan result, 1)
	go func() {
		gr, err := h.g.Reserve(ctx, Request{Authority: auth, Holder: holder, Role: "test", Bytes: n, Priority: pri, Deadline: deadline})
		ch <- result{gr, err}
	}()
	return ch
}

func await(t testing.TB, ch <-chan result) result {
	t.Helper()
	return watchdog.Recv(t, watchdog.Bound, "the reservation", ch)
}

func mustKind(t testing.TB, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("error %v, want %v", err, kind)
	}
}

// leaseHolder is a holder that reclaims from its leases: it refunds (or
// marks pending) up to frac percent of the bytes asked.
type leaseHolder struct {
	mu      sync.Mutex
	leases  []Lease
	frac    int // percent of Wanted to free
	pending bool
	tickets []Ticket
	onCall  func(Ticket)
}

func (lh *leaseHolder) add(l Lease) {
	lh.mu.Lock()
	lh.leases = append(lh.leases, l)
	lh.mu.Unlock()
}

func (lh *leaseHolder) Reclaim(ctx context.Context, t Ticket) (memapi.Bytes, error) {
	lh.mu.Lock()
	lh.tickets = append(lh.tickets, t)
	target := t.Wanted * memapi.Bytes(lh.frac) / 100
	leases := append([]Lease(nil), lh.leases...)
	pending, onCall := lh.pending, lh.onCall
	lh.mu.Unlock()
	if onCall != nil {
		onCall(t)
	}
	var freed memapi.Bytes
	for _, l := range leases {
		if freed >= target || l.Authority() != t.Authority {
			continue
		}
		n := min(target-freed, l.charged())
		var err error
		if pending {
			err = l.MarkPending(n)
		} else {
			err = l.Refund(n)
		}
		if err != nil {
			return freed, err
		}
		freed += n
	}
	return freed, nil
}

func (lh *leaseHolder) ticketsSeen() []Ticket {
	lh.mu.Lock()
	defer lh.mu.Unlock()
	return append([]Ticket(nil), lh.tickets...)
}

// The figures tests read of a grant or a lease (the package exports what
// its callers use).

func (h Grant) holder() HolderID {
	if h.g == nil {
		return ""
	}
	return h.g.acct.h.id
}

// drawnNow returns the bytes drawn now: 0 once committed (they are the
// lease's) or cancelled; an expired grant's until they are undrawn.
func (h Grant) drawnNow() memapi.Bytes {
	var d memapi.Bytes
	h.read(func(gr *grant) { d = gr.drawn() })
	return d
}

func (h Grant) remaining() memapi.Bytes {
	var r memapi.Bytes
	h.read(func(gr *grant) {
		if gr.state == stateOpen {
			r = gr.size - gr.bytes
		}
	})
	return r
}

func (l Lease) holder() HolderID { return Grant(l).holder() }

// charged returns the bytes charged and not pending.
func (l Lease) charged() memapi.Bytes {
	return l.figure(func(gr *grant) memapi.Bytes { return gr.bytes })
}

// quarantined returns the part of the charged bytes whose free failed: the
// memory is still held by its mechanism, waiting for a retry.
func (l Lease) quarantined() memapi.Bytes {
	return l.figure(func(gr *grant) memapi.Bytes { return gr.quarantined })
}

func (l Lease) pending() memapi.Bytes {
	return l.figure(func(gr *grant) memapi.Bytes { return gr.pending })
}

func (h Grant) deadline() time.Time {
	if h.g == nil || h.g.dl == nil {
		return time.Time{}
	}
	return h.g.dl.at
}

// TestRecordFitsSixtyFourBytes: every Reserve allocates a record, and its
// size class is most of the cycle's cost; a field that makes it larger must
// be weighed against BenchmarkCyclePending.
func TestRecordFitsSixtyFourBytes(t *testing.T) {
	if n := unsafe.Sizeof(grant{}); n > 64 {
		t.Fatalf("the grant record is %d bytes, over 64", n)
	}
}
