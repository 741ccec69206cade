package xproc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
)

// Two members of one ledger (here in one process, on two slots) share its
// capacity: what one has claimed the other cannot reserve, and the loser's
// error is ErrOverBudget with the shared figures. Settle hands freed bytes
// back.
func TestSharedAdmission(t *testing.T) {
	path := ledgerPath(t)
	la, a, ga := member(t, path, 1000, Options{Poll: time.Hour})
	lb, b, _ := member(t, path, 1000, Options{Poll: time.Hour})
	if la.slot == lb.slot {
		t.Fatal("two members on one slot")
	}
	ls := take(t, a, 700)
	_, err := b.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 400})
	var ob *governor.OverBudgetError
	if !errors.As(err, &ob) || !errors.Is(err, memapi.ErrOverBudget) || ob.Capacity != 1000 || ob.Free != 300 || ob.Wanted != 400 {
		t.Fatalf("B over the shared capacity: %v", err)
	}
	lsB := take(t, b, 300)
	h, s := inspect(t, path)
	if h.Claimed != 1000 || s[la.slot].Claim != 700 || s[lb.slot].Claim != 300 {
		t.Fatalf("claims: %+v %v", h, s)
	}
	if sa, _ := ga.Authority("dev"); sa.Capacity != 700 {
		t.Fatalf("A's local capacity %d, want its claim 700", sa.Capacity)
	}
	if err := ls.Refund(700); err != nil {
		t.Fatal(err)
	}
	// Freed but not settled: still A's claim, so B still cannot have it.
	if _, err := b.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 100}); !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("before A settles: %v", err)
	}
	a.Settle()
	ls2 := take(t, b, 500)
	b.Settle()
	h, s = inspect(t, path)
	if h.Claimed != 800 || h.Charged != 800 || s[lb.slot].Charged != 800 || s[la.slot].Claim != 0 {
		t.Fatalf("after the hand-over: %+v", h)
	}
	if err := lb.Close(); !errors.Is(err, errInUse) {
		t.Fatalf("Close with bytes charged: %v", err)
	}
	_ = ls2.Refund(500)
	_ = lsB.Refund(300)
	if err := lb.Close(); err != nil {
		t.Fatal(err)
	}
	if h, _ := inspect(t, path); h.Claimed != 0 || h.Charged != 0 {
		t.Fatalf("after B left: %+v", h)
	}
}

// A reservation that may wait posts its want; the other member's watcher
// answers with a ticket to its holder, which frees, and the bytes move
// across. The ticket carries the asking reservation's priority.
func TestCrossProcessPressure(t *testing.T) {
	path := ledgerPath(t)
	_, a, ga := member(t, path, 1000, Options{})
	_, b, _ := member(t, path, 1000, Options{})
	var cachedP atomic.Pointer[governor.Lease]
	got := make(chan governor.Ticket, 64)
	cache := governor.HolderFunc(func(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		got <- tk
		c := cachedP.Load()
		if c == nil {
			return 0, nil
		}
		n := min(tk.Wanted, c.Bytes())
		return n, c.Refund(n)
	})
	// Its guarantee is never asked for, from another process either.
	if err := ga.Register("cache", cache, governor.HolderOptions{Guarantee: map[memapi.AuthorityID]memapi.Bytes{"dev": 500}}); err != nil {
		t.Fatal(err)
	}
	gr, err := a.Reserve(context.Background(), governor.Request{Holder: "cache", Role: "blocks", Bytes: 900})
	if err != nil {
		t.Fatal(err)
	}
	_ = gr.Draw(900)
	cached, _ := gr.Commit()
	cachedP.Store(&cached)
	defer func() { _ = cached.Refund(cached.Bytes()) }() // so A can leave
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	grB, err := b.Reserve(ctx, governor.Request{Holder: "h", Role: "r", Bytes: 500, Priority: 7})
	if err != nil {
		t.Fatalf("B's reservation under pressure: %v", err)
	}
	defer grB.Cancel()
	tk := <-got
	if tk.Priority != 7 || tk.Wanted == 0 {
		t.Fatalf("ticket %+v, want B's priority 7", tk)
	}
	if c := cached.Bytes(); c > 500 || c < 500 {
		t.Fatalf("A's cache holds %d, want its guarantee 500: 400 freed for B, none of the guarantee", c)
	}
	// A reservation that cannot wait fails at once, without tickets.
	_, err = b.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 1000})
	if !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("no-wait reservation: %v", err)
	}
}

// The operator's limits change is applied, deferred or refused, and says so.
func TestSetCapacityOutcomes(t *testing.T) {
	path := ledgerPath(t)
	events := make(chan event, 16)
	_, a, _ := member(t, path, 1000, Options{onEvent: func(e event) { events <- e }})
	ls := take(t, a, 600)
	defer ls.Refund(600)
	h, _ := inspect(t, path)
	ch, err := SetCapacity(context.Background(), path, 800, h.Revision)
	if err != nil || ch.Outcome != Applied || ch.Revision != h.Revision+1 || ch.Capacity != 800 {
		t.Fatalf("grow/shrink above the claims: %+v %v", ch, err)
	}
	ch, err = SetCapacity(context.Background(), path, 500, h.Revision)
	if err != nil || ch.Outcome != Refused || ch.Capacity != 800 {
		t.Fatalf("stale revision: %+v %v", ch, err)
	}
	ch, err = SetCapacity(context.Background(), path, 0, 0)
	if err != nil || ch.Outcome != Refused {
		t.Fatalf("capacity 0: %+v %v", ch, err)
	}
	ch, err = SetCapacity(context.Background(), path, 500, 0)
	if err != nil || ch.Outcome != Deferred || ch.Excess != 100 {
		t.Fatalf("below the claims: %+v %v", ch, err)
	}
	// Deferred holds for new claims at once.
	if _, err := a.Reserve(context.Background(), governor.Request{Holder: "h", Role: "r", Bytes: 1}); !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("a claim under a deferred capacity: %v", err)
	}
	deadline := time.After(watchdog.Bound)
	for {
		select {
		case e := <-events:
			if e.Kind == eventLimits && e.Capacity == 500 {
				return
			}
		case <-deadline:
			t.Fatalf("watchdog: no EventLimits for the revision with capacity 500 within %v", watchdog.Bound)
		}
	}
}

// A reservation that fails locally (bad size, unknown holder, a holder's
// limit) returns the governor's typed error and leaves no claim behind.
func TestFailedReserveLeavesNoClaim(t *testing.T) {
	path := ledgerPath(t)
	_, a, g := member(t, path, 1000, Options{Poll: time.Hour})
	if err := g.Register("capped", nil, governor.HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{"dev": 100}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		holder governor.HolderID
		bytes  memapi.Bytes
		want   error
	}{
		{"h", 0, memapi.ErrInvalidSize},
		{"h", 1 << 60, memapi.ErrInvalidSize},
		{"nobody", 10, governor.ErrUnknown},
		{"capped", 200, memapi.ErrOverBudget},
	} {
		if _, err := a.Reserve(ctx, governor.Request{Holder: c.holder, Role: "r", Bytes: c.bytes}); !errors.Is(err, c.want) {
			t.Fatalf("%s %d: %v, want %v", c.holder, c.bytes, err, c.want)
		}
		if h, _ := inspect(t, path); h.Claimed != 0 {
			t.Fatalf("%s %d: %d bytes left claimed", c.holder, c.bytes, h.Claimed)
		}
	}
}
