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

func TestReclaimMayReenterTheGovernor(t *testing.T) {
	const gpu memapi.AuthorityID = "cuda:0"
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000, gpu: 100})
	cache := &leaseHolder{frac: 100}
	h.register("cache", cache, HolderOptions{})
	h.register("req", nil, HolderOptions{})
	cache.add(h.lease(hostA, "cache", 800))

	var inside []string
	cache.onCall = func(tk Ticket) {
		// Every kind of call a holder may make while the governor asks it.
		s := h.g.Snapshot()
		inside = append(inside, "snapshot")
		if len(s.Authorities) != 2 {
			t.Errorf("snapshot inside Reclaim: %d authorities", len(s.Authorities))
		}
		if _, ok := h.g.Authority(hostA); ok {
			inside = append(inside, "authority")
		}
		gr, err := h.g.Reserve(context.Background(), Request{Authority: gpu, Holder: "cache", Role: "staging", Bytes: 50})
		if err != nil {
			t.Errorf("reserve on another authority inside Reclaim: %v", err)
			return
		}
		inside = append(inside, "reserve")
		if err := gr.Draw(50); err != nil {
			t.Error(err)
		}
		l, err := gr.Commit()
		if err != nil {
			t.Error(err)
		}
		if err := l.MarkPending(50); err != nil {
			t.Error(err)
		}
		l.release()
		inside = append(inside, "lease")
	}
	done := make(chan result, 1)
	go func() {
		gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "kv", Bytes: 500, Priority: 1})
		done <- result{gr, err}
	}()
	r := await(t, done) // a deadlock would trip the watchdog
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := strings.Join(inside, ","); got != "snapshot,authority,reserve,lease" {
		t.Fatalf("calls inside Reclaim: %s", got)
	}
	// The holder refunded 300 from inside Reclaim, which served the request
	// before it ever waited.
	if w := h.eventsOf(EventWaiting); len(w) != 0 {
		t.Fatalf("request waited: %+v", w)
	}
	h.wantLedger(hostA, ledger{Reserved: 500, Charged: 500, Free: 0})
	h.wantLedger(gpu, ledger{Free: 100})
	if tk := cache.ticketsSeen(); len(tk) != 1 || tk[0].Wanted != 300 || tk[0].Authority != hostA || tk[0].Priority != 1 {
		t.Fatalf("tickets %+v", tk)
	}
}

func TestHolderThatFreesZero(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	stingy := &leaseHolder{frac: 0}
	h.register("stingy", stingy, HolderOptions{})
	h.register("req", nil, HolderOptions{})
	stingy.add(h.lease(hostA, "stingy", 900))
	before := h.ledger(hostA)

	ch := h.reserveAsync(context.Background(), hostA, "req", 300, 0, epoch.Add(5*time.Second))
	h.awaitWaiting("req")
	h.clock.Advance(5 * time.Second)
	r := await(t, ch)
	var ob *OverBudgetError
	if !errors.As(r.err, &ob) {
		t.Fatalf("error %v, want *OverBudgetError", r.err)
	}
	if ob.Tickets != 1 || ob.Freed != 0 || !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("figures %+v", ob)
	}
	h.wantLedger(hostA, before)
	s := h.g.Snapshot()
	hs := s.Holders[1] // sorted: req, stingy
	if hs.ID != "stingy" || len(hs.Authorities) != 1 || hs.Authorities[0].Tickets != 1 || hs.Authorities[0].Freed != 0 {
		t.Fatalf("holder snapshot %+v", hs)
	}
	if a := s.Authorities[0]; a.Waiters != 0 || a.Asking != 0 || a.Cancelled != 1 || a.OverBudget != 1 {
		t.Fatalf("authority after the failed wait %+v", a)
	}
}

func TestTicketDeadline(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	// The holder releases memory that must wait for fences: pending.
	slow := &leaseHolder{frac: 100, pending: true}
	h.register("slow", slow, HolderOptions{})
	h.register("req", nil, HolderOptions{})
	l := h.lease(hostA, "slow", 1000)
	slow.add(l)

	deadline := epoch.Add(3 * time.Second)
	ch := h.reserveAsync(context.Background(), hostA, "req", 400, 7, deadline)
	h.awaitWaiting("req")
	tk := slow.ticketsSeen()
	if len(tk) != 1 || !tk[0].Deadline.Equal(deadline) || tk[0].Priority != 7 || tk[0].Wanted != 400 || tk[0].Authority != hostA || tk[0].ID == 0 {
		t.Fatalf("ticket %+v", tk)
	}
	h.wantLedger(hostA, ledger{Charged: 600, Pending: 400})
	// The fences do not complete before the deadline: the wait fails.
	h.clock.Advance(3 * time.Second)
	r := await(t, ch)
	mustKind(t, r.err, memapi.ErrOverBudget)
	mustKind(t, r.err, context.DeadlineExceeded)
	var ob *OverBudgetError
	if errors.As(r.err, &ob); ob.Pending != 400 || ob.Freed != 400 {
		t.Fatalf("figures %+v", ob)
	}
	// When they complete later, the bytes are free for the next request.
	if err := l.Refund(400); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Charged: 600, Free: 400})
	if n := h.clock.Pending(); n != 0 {
		t.Fatalf("%d timers left", n)
	}
}

func TestPendingRefundWakesWaiter(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	slow := &leaseHolder{frac: 100, pending: true}
	h.register("slow", slow, HolderOptions{})
	h.register("req", nil, HolderOptions{})
	h.register("req2", nil, HolderOptions{})
	l := h.lease(hostA, "slow", 1000)
	slow.add(l)

	ch := h.reserveAsync(context.Background(), hostA, "req", 400, 0, time.Time{})
	h.awaitWaiting("req")
	// A second request does not ask for the bytes already on their way.
	ch2 := h.reserveAsync(context.Background(), hostA, "req2", 100, 0, time.Time{})
	h.awaitWaiting("req2")
	if tk := slow.ticketsSeen(); len(tk) != 2 || tk[0].Wanted != 400 || tk[1].Wanted != 100 {
		t.Fatalf("tickets %+v", tk)
	}
	if err := l.Refund(400); err != nil { // the fences completed
		t.Fatal(err)
	}
	if r := await(t, ch); r.err != nil || r.gr.Size() != 400 {
		t.Fatalf("first waiter: %+v", r)
	}
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	if r := await(t, ch2); r.err != nil {
		t.Fatal(r.err)
	}
	h.wantLedger(hostA, ledger{Reserved: 500, Charged: 500})
	if s := h.auth(hostA); s.Waited != 2 || len(h.eventsOf(EventServed)) != 2 {
		t.Fatalf("waited %d served events %d", s.Waited, len(h.eventsOf(EventServed)))
	}
}

func TestCancelledWaiterLeavesNoTrace(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("busy", nil, HolderOptions{})
	h.register("big", nil, HolderOptions{})
	h.register("small", nil, HolderOptions{})
	busy := h.lease(hostA, "busy", 800)
	before := h.auth(hostA)

	ctx, cancel := context.WithCancel(context.Background())
	big := h.reserveAsync(ctx, hostA, "big", 500, 0, time.Time{})
	h.awaitWaiting("big")
	small := h.reserveAsync(context.Background(), hostA, "small", 150, 0, time.Time{})
	h.awaitWaiting("small") // fits in the 200 free, but queues behind big
	if s := h.auth(hostA); s.Waiters != 2 || s.WaitingBytes != 650 {
		t.Fatalf("queue %+v", s)
	}
	cancel()
	r := await(t, big)
	mustKind(t, r.err, context.Canceled)
	mustKind(t, r.err, memapi.ErrOverBudget)
	// With big gone from the head, small is served at once.
	if r := await(t, small); r.err != nil {
		t.Fatal(r.err)
	}
	after := h.auth(hostA)
	if after.Waiters != 0 || after.WaitingBytes != 0 || after.Reserved != 150 || after.Charged != before.Charged {
		t.Fatalf("after cancel %+v", after)
	}
	for _, hs := range h.g.Snapshot().Holders {
		if hs.ID == "big" && (len(hs.Authorities) != 1 || hs.Authorities[0] != (HolderAuthoritySnapshot{Authority: hostA})) {
			t.Fatalf("cancelled holder left figures: %+v", hs.Authorities)
		}
	}
	busy.release()
}

func TestCancelledWaiterServedAtTheSameInstant(t *testing.T) {
	// A wait that ends by its context right as a refund serves it gives
	// the grant back: the failed Reserve leaves the ledger as it was.
	for range 50 {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
		h.register("x", nil, HolderOptions{})
		l := h.lease(hostA, "x", 100)
		ctx, cancel := context.WithCancel(context.Background())
		ch := h.reserveAsync(ctx, hostA, "x", 100, 0, time.Time{})
		h.awaitWaiting("x")
		go cancel()
		l.release()
		r := await(t, ch)
		s := h.auth(hostA)
		if r.err == nil {
			if s.Reserved != 100 || s.Grants != 1 {
				t.Fatalf("served but ledger %+v", s)
			}
			if err := r.gr.Cancel(); err != nil {
				t.Fatal(err)
			}
		} else if s.Reserved != 0 || s.Grants != 0 || s.Free != 100 {
			t.Fatalf("failed (%v) but ledger %+v", r.err, s)
		}
		cancel()
		h.g.Close()
	}
}

func TestFairnessLargeWaiterBeforeLaterSmallOnes(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("busy", nil, HolderOptions{})
	h.register("large", nil, HolderOptions{})
	h.register("small", nil, HolderOptions{})
	busy := h.lease(hostA, "busy", 900)

	large := h.reserveAsync(context.Background(), hostA, "large", 600, 0, time.Time{})
	h.awaitWaiting("large")
	var smalls []<-chan result
	for range 5 {
		smalls = append(smalls, h.reserveAsync(context.Background(), hostA, "small", 50, 0, time.Time{}))
		h.awaitWaiting("small") // each would fit in the 100 free bytes
	}
	noneReturned := func(chs ...<-chan result) {
		t.Helper()
		for _, ch := range chs {
			select {
			case r := <-ch:
				t.Fatalf("a later request was served out of order: %+v", r)
			default:
			}
		}
	}
	noneReturned(append(smalls, large)...)
	// 300 more free: still not enough for large, and nothing overtakes it.
	if err := busy.Refund(300); err != nil {
		t.Fatal(err)
	}
	noneReturned(append(smalls, large)...)
	if err := busy.Refund(200); err != nil {
		t.Fatal(err)
	}
	if r := await(t, large); r.err != nil {
		t.Fatal(r.err)
	}
	// Free is now 0: the small ones keep waiting, then go in order.
	noneReturned(smalls...)
	if err := busy.Refund(100); err != nil {
		t.Fatal(err)
	}
	await(t, smalls[0])
	await(t, smalls[1])
	noneReturned(smalls[2:]...)
	if err := busy.Refund(300); err != nil {
		t.Fatal(err)
	}
	for _, ch := range smalls[2:] {
		if r := await(t, ch); r.err != nil {
			t.Fatal(r.err)
		}
	}
	h.wantLedger(hostA, ledger{Reserved: 850, Free: 150})
}

func TestHolderOverItsLimit(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 10000})
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 500}})
	l := h.lease(hostA, "kv", 300)
	before := h.ledger(hostA)

	_, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 201})
	mustKind(t, err, errOverLimit)
	mustKind(t, err, memapi.ErrOverBudget)
	var ob *OverBudgetError
	var me *memapi.Error
	if !errors.As(err, &ob) || ob.Limit != 500 || ob.HolderUse != 300 || ob.Wanted != 201 {
		t.Fatalf("figures %+v", ob)
	}
	if !errors.As(err, &me) || me.Wanted != 201 || me.Available != 200 || me.Authority != hostA {
		t.Fatalf("memapi figures %+v", me)
	}
	h.wantLedger(hostA, before)
	// Pending bytes still count against the limit until refunded.
	if err := l.MarkPending(300); err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 201})
	mustKind(t, err, errOverLimit)
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 200})
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 1})
	mustKind(t, err, errOverLimit)
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	l.release()
	if s := h.auth(hostA); s.OverBudget != 3 {
		t.Fatalf("over-budget count %d", s.OverBudget)
	}
}

func TestGuaranteesRespectedUnderPressure(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	low := &leaseHolder{frac: 100}
	low2 := &leaseHolder{frac: 100}
	mid := &leaseHolder{frac: 100}
	prot := &leaseHolder{frac: 100}
	h.register("low", low, HolderOptions{Priority: 0, Guarantee: map[memapi.AuthorityID]memapi.Bytes{hostA: 300}})
	h.register("low2", low2, HolderOptions{Priority: 0})
	h.register("mid", mid, HolderOptions{Priority: 1})
	h.register("prot", prot, HolderOptions{Priority: -5, Guarantee: map[memapi.AuthorityID]memapi.Bytes{hostA: 1000}})
	h.register("req", nil, HolderOptions{Priority: 9})
	low.add(h.lease(hostA, "low", 450)) // 150 over its guarantee
	low2.add(h.lease(hostA, "low2", 100))
	mid.add(h.lease(hostA, "mid", 200))
	prot.add(h.lease(hostA, "prot", 200)) // all guaranteed
	// free 50

	var order []HolderID
	for id, lh := range map[HolderID]*leaseHolder{"low": low, "low2": low2, "mid": mid, "prot": prot} {
		lh.onCall = func(Ticket) { order = append(order, id) }
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := h.reserveAsync(ctx, hostA, "req", 600, 9, time.Time{})
	h.awaitWaiting("req")
	// shortfall 550: low (priority 0, 150 over) before low2 (priority 0,
	// 100 over), then mid; prot is never asked, it is all guaranteed.
	if got := order; len(got) != 3 || got[0] != "low" || got[1] != "low2" || got[2] != "mid" {
		t.Fatalf("ask order %v", got)
	}
	if tk := low.ticketsSeen(); tk[0].Wanted != 150 {
		t.Fatalf("low asked %d, want its 150 over the guarantee", tk[0].Wanted)
	}
	if tk := low2.ticketsSeen(); tk[0].Wanted != 100 {
		t.Fatalf("low2 asked %d", tk[0].Wanted)
	}
	if tk := mid.ticketsSeen(); tk[0].Wanted != 200 {
		t.Fatalf("mid asked %d", tk[0].Wanted)
	}
	if len(prot.ticketsSeen()) != 0 {
		t.Fatal("guaranteed holder asked")
	}
	// free 500 < 600: still waiting; reclaimable is now 0.
	s := h.auth(hostA)
	if s.Free != 500 || s.Reclaimable != 0 {
		t.Fatalf("after reclaim %+v", s)
	}
	cancel()
	r := await(t, ch)
	var ob *OverBudgetError
	if !errors.As(r.err, &ob) || ob.Tickets != 3 || ob.Freed != 450 || ob.Reclaimable != 0 || ob.Free != 500 {
		t.Fatalf("error %v", r.err)
	}
	for _, hs := range h.g.Snapshot().Holders {
		if hs.ID == "low" && hs.Authorities[0].Charged != 300 {
			t.Fatalf("low kept %d, want its guarantee 300", hs.Authorities[0].Charged)
		}
		if hs.ID == "prot" && hs.Authorities[0].Charged != 200 {
			t.Fatalf("prot lost memory: %+v", hs.Authorities[0])
		}
	}
}

func TestStopsAskingOnceServed(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	generous := &leaseHolder{frac: 300} // frees three times what it is asked
	other := &leaseHolder{frac: 100}
	h.register("generous", generous, HolderOptions{Priority: 0})
	h.register("other", other, HolderOptions{Priority: 1})
	h.register("req", nil, HolderOptions{})
	generous.add(h.lease(hostA, "generous", 300))
	other.add(h.lease(hostA, "other", 700))
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "", Bytes: 300})
	if err != nil {
		t.Fatal(err)
	}
	if gr.Size() != 300 || len(other.ticketsSeen()) != 0 {
		t.Fatalf("other asked %d times after the request was served", len(other.ticketsSeen()))
	}
	s := h.auth(hostA)
	if s.Asking != 0 || s.Tickets != 1 {
		t.Fatalf("%+v", s)
	}
}

func TestReclaimErrorIsCountedAndNextHolderAsked(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	boom := errors.New("boom")
	h.register("bad", HolderFunc(func(context.Context, Ticket) (memapi.Bytes, error) { return 0, boom }), HolderOptions{Priority: 0})
	good := &leaseHolder{frac: 100}
	h.register("good", good, HolderOptions{Priority: 1})
	h.register("req", nil, HolderOptions{})
	h.lease(hostA, "bad", 500)
	good.add(h.lease(hostA, "good", 500))
	if _, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "", Bytes: 400}); err != nil {
		t.Fatal(err)
	}
	ev := h.eventsOf(EventReclaimed)
	if len(ev) != 2 || !errors.Is(ev[0].Err, boom) || ev[0].Holder != "bad" || ev[1].Holder != "good" || ev[1].Bytes != 400 {
		t.Fatalf("reclaimed events %+v", ev)
	}
	for _, hs := range h.g.Snapshot().Holders {
		if hs.ID == "bad" && hs.Authorities[0].ReclaimErrors != 1 {
			t.Fatalf("%+v", hs)
		}
	}
}

func TestOverBudgetErrorFigures(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("a", nil, HolderOptions{})
	b := &leaseHolder{frac: 0}
	h.register("b", b, HolderOptions{Guarantee: map[memapi.AuthorityID]memapi.Bytes{hostA: 100}})
	h.register("req", nil, HolderOptions{})
	la := h.lease(hostA, "a", 400)
	b.add(h.lease(hostA, "b", 300))
	if err := la.MarkPending(100); err != nil {
		t.Fatal(err)
	}
	// free 300, pending 100, reclaimable 200 (b over its guarantee)

	_, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "", Bytes: 1001})
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.Reason != "larger than the capacity" || ob.Tickets != 0 {
		t.Fatalf("oversized: %v", err)
	}

	ch := h.reserveAsync(context.Background(), hostA, "req", 900, 0, epoch.Add(time.Second))
	h.awaitWaiting("req")
	if p := h.eventsOf(EventPressure); len(p) != 1 || p[0].Bytes != 500 || !p[0].Time.Equal(epoch) || p[0].Holder != "req" || h.auth(hostA).PressureEvents != 1 {
		t.Fatalf("pressure events %+v", p)
	}
	if tk := h.eventsOf(EventTicket); len(tk) != 1 || tk[0].Holder != "b" || tk[0].Bytes != 200 {
		t.Fatalf("tickets %+v", tk)
	}
	h.clock.Advance(time.Second)
	err = await(t, ch).err
	if !errors.As(err, &ob) {
		t.Fatalf("%v", err)
	}
	want := OverBudgetError{
		Op: "governor.Reserve", Kind: memapi.ErrOverBudget, Authority: hostA, Holder: "req",
		Reason: "not served before the wait ended", Wanted: 900, Free: 300, Reclaimable: 200, Pending: 100,
		Charged: 600, Capacity: 1000, Tickets: 1, Err: context.DeadlineExceeded,
	}
	if *ob != want {
		t.Fatalf("figures\n got %+v\nwant %+v", *ob, want)
	}
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != 900 || me.Available != 300 || me.Kind != memapi.ErrOverBudget || me.Op != "governor.Reserve" {
		t.Fatalf("memapi view %+v", me)
	}
	msg := err.Error()
	for _, part := range []string{"over budget", "wanted 900", "free 300", "reclaimable 200", "pending 100", "authority host", "deadline exceeded"} {
		if !strings.Contains(msg, part) {
			t.Fatalf("message %q lacks %q", msg, part)
		}
	}
	if ev := h.eventsOf(EventOverBudget); len(ev) != 2 || ev[1].Err != err {
		t.Fatalf("over-budget events %+v", ev)
	}
}

func TestWaitDeadlineRacingServeAndExpiry(t *testing.T) {
	// At the deadline three things happen together: the wait ends, a refund
	// serves the waiter, and the served grant's own deadline expires it.
	// Whatever order they run in, the ledger stays whole.
	for range 100 {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
		h.register("x", nil, HolderOptions{})
		l := h.lease(hostA, "x", 100)
		ch := h.reserveAsync(context.Background(), hostA, "x", 100, 0, epoch.Add(time.Second))
		h.awaitWaiting("x")
		h.clock.AfterFunc(time.Second, func() { l.release() })
		h.clock.Advance(time.Second)
		h.clock.Advance(0) // the served grant's expiry
		r := await(t, ch)
		s := h.auth(hostA) // checks the identity
		if s.Reserved != 0 || s.Free != 100 || s.Grants != 0 || s.Waiters != 0 {
			t.Fatalf("err %v, ledger %+v", r.err, s)
		}
		if r.err == nil {
			mustKind(t, r.gr.Draw(1), context.DeadlineExceeded)
		}
		h.g.Close()
	}
}

func TestPanickingReclaimLeavesNoWaiter(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("bad", HolderFunc(func(context.Context, Ticket) (memapi.Bytes, error) { panic("holder bug") }), HolderOptions{})
	h.register("req", nil, HolderOptions{})
	l := h.lease(hostA, "bad", 100)
	func() {
		defer func() {
			if r := recover(); r != "holder bug" {
				t.Fatalf("recovered %v", r)
			}
		}()
		h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "", Bytes: 50})
		t.Fatal("Reserve returned")
	}()
	s := h.auth(hostA)
	if s.Waiters != 0 || s.WaitingBytes != 0 || s.Asking != 0 || s.Charged != 100 {
		t.Fatalf("after the panic %+v", s)
	}
	// The queue is not blocked.
	l.release()
	if _, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "req", Role: "", Bytes: 50}); err != nil {
		t.Fatal(err)
	}
}

// TestReclaimContextLastsTheWait: the context a holder's Reclaim gets ends
// when the reservation's wait does, not when the asking does. A holder
// that answered short (it had nothing free then) and frees a moment later
// while the reservation still waits sees the context alive, gives the
// bytes back, and the reservation is served; once Reserve returned, the
// context has ended.
func TestReclaimContextLastsTheWait(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	asked := make(chan context.Context, 1)
	h.register("late", HolderFunc(func(ctx context.Context, t Ticket) (memapi.Bytes, error) {
		asked <- ctx
		return 0, nil // everything in use now
	}), HolderOptions{})
	h.register("req", nil, HolderOptions{})
	l := h.lease(hostA, "late", 900)

	ch := h.reserveAsync(context.Background(), hostA, "req", 300, 0, epoch.Add(time.Minute))
	h.awaitWaiting("req") // asked, answered 0, waiting
	ctx := watchdog.Recv(t, bound, "the ticket", asked)
	if err := ctx.Err(); err != nil {
		t.Fatalf("the ticket's context ended while its reservation waits: %v", context.Cause(ctx))
	}
	// The holder's memory comes free: it gives back what it still owes.
	if err := l.Refund(300); err != nil {
		t.Fatal(err)
	}
	r := await(t, ch)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if ctx.Err() == nil {
		t.Fatal("the ticket's context outlived the wait")
	}
	if err := r.gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	if n := h.clock.Pending(); n != 0 {
		t.Fatalf("%d timers left", n)
	}
}
