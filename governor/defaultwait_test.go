package governor

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

// fill charges the whole of authority "gpu" to holder "a" and returns the
// lease, so the next reservation must wait.
func fillForWait(h *harness) Lease {
	h.register("a", HolderFunc(func(context.Context, Ticket) (memapi.Bytes, error) { return 0, nil }), HolderOptions{})
	return h.lease("gpu", "a", 100)
}

func pendingResult(t *testing.T, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("the reservation returned (%v, %v), want it still waiting", r.gr, r.err)
	case <-time.After(20 * time.Millisecond):
	}
}

// A reservation with no deadline, on context.Background(), fails after the
// default wait (30 s unless set) instead of waiting forever, and says why.
func TestNoDeadlineWaitsTheDefaultWait(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"gpu": 100})
	fillForWait(h)
	ch := h.reserveAsync(context.Background(), "gpu", "a", 10, 0, time.Time{})
	h.awaitWaiting("a")
	h.clock.Advance(defaultWaitBound - time.Second)
	pendingResult(t, ch)
	h.clock.Advance(time.Second)
	r := await(t, ch)
	if r.gr != (Grant{}) {
		t.Fatal("served, want the default wait to end it")
	}
	mustKind(t, r.err, errDefaultWait)
	mustKind(t, r.err, context.DeadlineExceeded)
	mustKind(t, r.err, memapi.ErrOverBudget)
	if !strings.Contains(r.err.Error(), "default wait of 30s") {
		t.Fatalf("error %q does not name the default wait", r.err)
	}
	h.wantLedger("gpu", ledger{Charged: 100})
	if s := h.auth("gpu"); s.Waiters != 0 {
		t.Fatalf("%d waiters left in the queue", s.Waiters)
	}
}

// Options.DefaultWait sets the bound; on the system clock too.
func TestDefaultWaitIsSettable(t *testing.T) {
	g := New(Options{DefaultWait: 10 * time.Millisecond})
	t.Cleanup(func() { g.Close() })
	if err := g.AddAuthority("gpu", 100); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("a", HolderFunc(func(context.Context, Ticket) (memapi.Bytes, error) { return 0, nil }), HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(context.Background(), Request{Authority: "gpu", Holder: "a", Role: "r", Bytes: 100}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := g.Reserve(context.Background(), Request{Authority: "gpu", Holder: "a", Role: "r", Bytes: 1})
		done <- err
	}()
	if err := watchdog.Recv(t, watchdog.Bound, "a reservation with no deadline, past the 10 ms default wait", done); !errors.Is(err, errDefaultWait) {
		t.Fatalf("error %v, want errDefaultWait", err)
	}
}

// A negative DefaultWait removes the bound: the reservation waits until it
// is served.
func TestNegativeDefaultWaitWaitsUntilServed(t *testing.T) {
	h := newHarness(t, nil)
	h.g = New(Options{Clock: h.clock, OnEvent: h.record, DefaultWait: -1})
	t.Cleanup(func() { h.g.Close() })
	if err := h.g.AddAuthority("gpu", 100); err != nil {
		t.Fatal(err)
	}
	l := fillForWait(h)
	ch := h.reserveAsync(context.Background(), "gpu", "a", 10, 0, time.Time{})
	h.awaitWaiting("a")
	h.clock.Advance(time.Hour)
	pendingResult(t, ch)
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	r := await(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	_ = r.gr.Cancel()
}

// A deadline of the reservation's own, or of its ctx, is the bound: the
// default wait neither shortens nor replaces it.
func TestADeadlineOverridesTheDefaultWait(t *testing.T) {
	for _, kind := range []string{"reservation", "ctx"} {
		t.Run(kind, func(t *testing.T) {
			h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"gpu": 100})
			l := fillForWait(h)
			ctx := context.Background()
			var deadline time.Time
			if kind == "ctx" {
				c, cancel := context.WithTimeout(ctx, time.Hour)
				defer cancel()
				ctx = c
			} else {
				deadline = h.clock.Now().Add(time.Hour)
			}
			ch := h.reserveAsync(ctx, "gpu", "a", 10, 0, deadline)
			h.awaitWaiting("a")
			h.clock.Advance(2 * defaultWaitBound)
			pendingResult(t, ch)
			if err := l.Refund(100); err != nil {
				t.Fatal(err)
			}
			r := await(t, ch)
			if r.err != nil {
				t.Fatal(r.err)
			}
			_ = r.gr.Cancel()
		})
	}
}

// blockingAdmission waits in Admit until its context ends, as a shared
// ledger's lock does behind a stopped holder, and returns the cause.
type blockingAdmission struct{ entered chan struct{} }

func (b blockingAdmission) Admit(ctx context.Context, _ HolderID, _, _ memapi.Bytes, _ int, _ bool) error {
	b.entered <- struct{}{}
	<-ctx.Done()
	return context.Cause(ctx)
}

// The default wait bounds an Admission's wait too: a reservation with no
// deadline anywhere whose Admission blocks (a shared ledger's lock held by
// a stopped process) ends at the default wait, with errDefaultWait.
func TestDefaultWaitBoundsTheAdmission(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"gpu": 0})
	h.register("a", nil, HolderOptions{})
	adm := blockingAdmission{entered: make(chan struct{}, 1)}
	if err := h.g.SetAdmission("gpu", adm); err != nil {
		t.Fatal(err)
	}
	ch := h.reserveAsync(context.Background(), "gpu", "a", 10, 0, time.Time{})
	watchdog.Recv(t, watchdog.Bound, "the Admission's call", adm.entered)
	h.clock.Advance(defaultWaitBound - time.Second)
	pendingResult(t, ch)
	h.clock.Advance(time.Second)
	r := await(t, ch)
	if r.gr != (Grant{}) {
		t.Fatal("served, want the default wait to end it")
	}
	mustKind(t, r.err, errDefaultWait)
	h.wantLedger("gpu", ledger{})
}
