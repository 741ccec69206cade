package governor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

func TestRegistryErrors(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	ctx := context.Background()
	mustKind(t, h.g.AddAuthority(hostA, 5), errDuplicate)
	mustKind(t, h.g.AddAuthority("big", maxBytes+1), memapi.ErrInvalidSize)
	h.register("x", nil, HolderOptions{})
	mustKind(t, h.g.Register("x", nil, HolderOptions{}), errDuplicate)
	mustKind(t, h.g.Register("y", nil, HolderOptions{
		Guarantee: map[memapi.AuthorityID]memapi.Bytes{hostA: 50},
		Limit:     map[memapi.AuthorityID]memapi.Bytes{hostA: 40},
	}), memapi.ErrInvalidSize)

	_, err := h.g.Reserve(ctx, Request{Authority: "nowhere", Holder: "x", Role: "", Bytes: 1})
	mustKind(t, err, errUnknownAuthority)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "nobody", Role: "", Bytes: 1})
	mustKind(t, err, errUnknownHolder)
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "x", Role: "", Bytes: 0})
	mustKind(t, err, memapi.ErrInvalidSize)

	l := h.lease(hostA, "x", 10)
	mustKind(t, h.g.Unregister("x"), memapi.ErrInUse)
	mustKind(t, h.g.RemoveAuthority(hostA), memapi.ErrInUse)
	mustKind(t, h.g.Unregister("nobody"), errUnknownHolder)
	l.release()
	if err := h.g.Unregister("x"); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "x", Role: "", Bytes: 1})
	mustKind(t, err, errUnknownHolder)
	if err := h.g.RemoveAuthority(hostA); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.g.Authority(hostA); ok {
		t.Fatal("a removed authority is still there")
	}
	mustKind(t, h.g.SetCapacity(hostA, 1), errUnknownAuthority)
	mustKind(t, h.g.RemoveAuthority(hostA), errUnknownAuthority)
	// The id can be used again.
	if err := h.g.AddAuthority(hostA, 7); err != nil {
		t.Fatal(err)
	}
	if err := h.g.Register("x", nil, HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 7})
}

func TestSetCapacity(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 200})
	h.register("x", nil, HolderOptions{})
	h.register("y", nil, HolderOptions{})
	l := h.lease(hostA, "x", 180)
	err := h.g.SetCapacity(hostA, 179)
	mustKind(t, err, memapi.ErrInUse)
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != 179 || me.Available != 180 {
		t.Fatalf("figures %+v", me)
	}
	h.wantLedger(hostA, ledger{Charged: 180, Free: 20})

	first := h.reserveAsync(context.Background(), hostA, "y", 50, 0, time.Time{})
	h.awaitWaiting("y")
	huge := h.reserveAsync(context.Background(), hostA, "y", 150, 0, time.Time{})
	h.awaitWaiting("y")
	third := h.reserveAsync(context.Background(), hostA, "y", 30, 0, time.Time{})
	h.awaitWaiting("y")
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	if r := await(t, first); r.err != nil {
		t.Fatal(r.err)
	}
	// Shrinking to 140: the 150-byte waiter can never fit, so it fails
	// rather than block the queue; the next one still lacks bytes.
	if err := h.g.SetCapacity(hostA, 140); err != nil {
		t.Fatal(err)
	}
	r := await(t, huge)
	var ob *OverBudgetError
	if !errors.As(r.err, &ob) || ob.Reason != "larger than the capacity" || ob.Capacity != 140 || ob.Waiting != 0 {
		t.Fatalf("huge waiter: %v", r.err)
	}
	h.wantLedger(hostA, ledger{Reserved: 50, Charged: 80, Free: 10})
	// Growing serves the queue.
	if err := h.g.SetCapacity(hostA, 170); err != nil {
		t.Fatal(err)
	}
	if r := await(t, third); r.err != nil {
		t.Fatal(r.err)
	}
	h.wantLedger(hostA, ledger{Reserved: 80, Charged: 80, Free: 10})
	l.release()
	if ev := h.eventsOf(EventCapacity); len(ev) != 3 || ev[1].Bytes != 140 || ev[2].Bytes != 170 {
		t.Fatalf("capacity events %+v", ev)
	}
}

func TestCloseWakesWaitersAndStopsTimers(t *testing.T) {
	const gpu memapi.AuthorityID = "cuda:0"
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100, gpu: 100})
	h.register("x", nil, HolderOptions{})
	l := h.lease(hostA, "x", 100)
	ch := h.reserveAsync(context.Background(), hostA, "x", 10, 0, time.Time{}) // no deadline, uncancellable ctx: the default wait bounds it
	h.awaitWaiting("x")
	if err := l.Refund(5); err != nil { // not enough
		t.Fatal(err)
	}
	timed, err := h.g.Reserve(context.Background(), Request{Authority: gpu, Holder: "x", Role: "", Bytes: 20, Deadline: epoch.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	// The waiter's default wait (Options.DefaultWait) keeps one timer
	// while it waits (its reclaim context's ended with the asking).
	if h.clock.Pending() != 2 {
		t.Fatalf("%d timers, want the waiter's and the timed grant's", h.clock.Pending())
	}
	if err := h.g.Close(); err != nil {
		t.Fatal(err)
	}
	r := await(t, ch)
	mustKind(t, r.err, memapi.ErrClosed)
	if n := h.clock.Pending(); n != 0 {
		t.Fatalf("%d timers after Close", n)
	}
	_, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "x", Role: "", Bytes: 1})
	mustKind(t, err, memapi.ErrClosed)
	mustKind(t, h.g.AddAuthority("other", 1), memapi.ErrClosed)
	mustKind(t, h.g.Register("z", nil, HolderOptions{}), memapi.ErrClosed)
	if err := h.g.Close(); err != nil {
		t.Fatal(err)
	}
	// Grants and leases still unwind after Close; a grant past its
	// deadline still refuses draws, without its timer.
	l.release()
	h.wantLedger(hostA, ledger{Free: 100})
	h.clock.Advance(time.Hour)
	mustKind(t, timed.Draw(1), context.DeadlineExceeded)
	h.wantLedger(gpu, ledger{Free: 100})
}
