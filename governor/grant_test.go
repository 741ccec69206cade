package governor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

const hostA memapi.AuthorityID = "host"

func TestGrantCommitMovesDrawnBytesToLease(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()

	gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 300, Priority: 5})
	if err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Reserved: 300, Free: 700})
	if err := gr.Draw(200); err != nil {
		t.Fatal(err)
	}
	if gr.drawnNow() != 200 || gr.remaining() != 100 {
		t.Fatalf("drawn %d remaining %d", gr.drawnNow(), gr.remaining())
	}
	h.wantLedger(hostA, ledger{Reserved: 300, Free: 700}) // drawing moves nothing between figures
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Charged: 200, Free: 800})
	if l.charged() != 200 || l.pending() != 0 || l.holder() != "kv" || l.Authority() != hostA {
		t.Fatalf("lease %d/%d %s %s", l.charged(), l.pending(), l.holder(), l.Authority())
	}
	s := h.auth(hostA)
	if s.Grants != 0 || s.Leases != 1 || s.Granted != 1 {
		t.Fatalf("counts %+v", s)
	}
	if err := l.Refund(200); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
	if s := h.auth(hostA); s.Leases != 0 {
		t.Fatalf("leases %d after full refund", s.Leases)
	}
}

func TestGrantErrorsChangeNothing(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("w", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "w", Role: "weights", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(60); err != nil {
		t.Fatal(err)
	}
	before := h.ledger(hostA)

	err = gr.Draw(41)
	mustKind(t, err, memapi.ErrGrantExhausted)
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != 41 || me.Available != 40 || me.Authority != hostA {
		t.Fatalf("exhausted error figures: %#v", me)
	}
	mustKind(t, gr.Undraw(61), errOverReturn)
	err = gr.Cancel()
	mustKind(t, err, memapi.ErrInUse) // backing still installed: the ledger must not forget it
	if !errors.As(err, &me) || me.Wanted != 60 {
		t.Fatalf("cancel error figures: %#v", me)
	}
	if gr.drawnNow() != 60 || !isOpen(gr) {
		t.Fatalf("failed calls changed the grant: drawn %d open %v", gr.drawnNow(), isOpen(gr))
	}
	h.wantLedger(hostA, before)

	// Rolling back (refund = undraw) makes the cancel possible.
	if err := gr.Refund(60); err != nil {
		t.Fatal(err)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
	if err := gr.Cancel(); err != nil {
		t.Fatalf("second cancel: %v", err)
	}
	mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
	_, err = gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, gr.Undraw(1), memapi.ErrGrantClosed)

	gr2, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "w", Role: "weights", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	l, err := gr2.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if l.Bytes() != 0 {
		t.Fatalf("empty commit gave %d bytes", l.Bytes())
	}
	mustKind(t, gr2.Cancel(), memapi.ErrGrantClosed)
	_, err = gr2.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
	h.wantLedger(hostA, ledger{Free: 1000})
}

func TestGrantDeadlineReclaimsUndrawnAndKeepsDrawn(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("ws", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "ws", Role: "workspace", Bytes: 400, Deadline: epoch.Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(150); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(9 * time.Second)
	if !isOpen(gr) {
		t.Fatal("grant closed before its deadline")
	}
	h.clock.Advance(time.Second)
	if isOpen(gr) {
		t.Fatal("grant open after its deadline")
	}
	// Undrawn bytes are back; the drawn (installed) bytes stay reserved.
	h.wantLedger(hostA, ledger{Reserved: 150, Free: 850})
	s := h.auth(hostA)
	if s.ExpiredDrawn != 150 || s.ExpiredGrants != 1 || s.Grants != 0 {
		t.Fatalf("after expiry: %+v", s)
	}
	err = gr.Draw(1)
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, err, context.DeadlineExceeded)
	_, err = gr.Commit()
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, gr.Cancel(), memapi.ErrInUse)

	if ev := h.eventsOf(EventGrantExpired); len(ev) != 1 || ev[0].Bytes != 250 || ev[0].Drawn != 150 || ev[0].Holder != "ws" {
		t.Fatalf("expiry events %+v", ev)
	}
	// The rollback undraws; the bytes return to free.
	if err := gr.Undraw(100); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Reserved: 50, Free: 950})
	if err := gr.Refund(50); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
	if s := h.auth(hostA); s.ExpiredDrawn != 0 {
		t.Fatalf("expired drawn %d", s.ExpiredDrawn)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatalf("cancel of a rolled-back expired grant: %v", err)
	}
	if n := h.clock.Pending(); n != 0 {
		t.Fatalf("%d timers left", n)
	}
}

func TestGrantDeadlineSeenWithoutTimer(t *testing.T) {
	// A grant past its deadline refuses Draw even if its timer has not run
	// (a real timer may fire late).
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("x", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "x", Role: "", Bytes: 10, Deadline: epoch.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	h.clock.mu.Lock()
	h.clock.now = h.clock.now.Add(2 * time.Second) // time passes, the timer does not run
	h.clock.mu.Unlock()
	mustKind(t, gr.Draw(1), context.DeadlineExceeded)
	h.wantLedger(hostA, ledger{Free: 100})
	if n := h.clock.Pending(); n != 0 {
		t.Fatalf("expiry left %d timers", n)
	}
}

func TestCommitStopsDeadline(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("x", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "x", Role: "", Bytes: 10, Deadline: epoch.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(10); err != nil {
		t.Fatal(err)
	}
	if _, err := gr.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := h.clock.Pending(); n != 0 {
		t.Fatalf("commit left %d timers", n)
	}
	h.clock.Advance(time.Hour)
	h.wantLedger(hostA, ledger{Charged: 10, Free: 90})
}

func TestReserveWithPastDeadline(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("x", nil, HolderOptions{})
	_, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "x", Role: "", Bytes: 10, Deadline: epoch})
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, err, context.DeadlineExceeded)
	h.wantLedger(hostA, ledger{Free: 100})
}

func TestGrantDrawIsAtomic(t *testing.T) {
	// Concurrent draws never take more than the grant.
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1 << 20})
	h.register("x", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "x", Role: "", Bytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	for range 8 {
		go func() {
			ok := 0
			for range 200 {
				if gr.Draw(1) == nil {
					ok++
				}
			}
			done <- ok
		}()
	}
	total := 0
	for range 8 {
		total += watchdog.Recv(t, bound, "a drawing goroutine", done)
	}
	if total != 1000 || gr.drawnNow() != 1000 {
		t.Fatalf("%d draws succeeded, drawn %d", total, gr.drawnNow())
	}
}
