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

// poolAdmission raises one authority's capacity from a pool of bytes, as a
// shared ledger would, and checks that it is called without the
// authority's lock.
type poolAdmission struct {
	t  testing.TB
	g  *Governor
	id memapi.AuthorityID

	during func() // run once, before the capacity grows, outside mu

	mu      sync.Mutex
	pool    memapi.Bytes
	calls   int
	needs   []memapi.Bytes
	decline bool
}

func (p *poolAdmission) Admit(_ context.Context, holder HolderID, bytes, need memapi.Bytes, _ int, _ bool) error {
	if a := p.g.authority(p.id); !a.mu.TryLock() {
		p.t.Error("Admit called with the authority's lock held")
		return errors.New("called under the lock") // calling the governor would deadlock
	} else {
		a.mu.Unlock()
	}
	if f := p.during; f != nil {
		p.during = nil
		f()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.needs = append(p.needs, need)
	if p.decline {
		return memapi.ErrUnavailable
	}
	if need > p.pool {
		return &OverBudgetError{Op: "pool.Admit", Kind: memapi.ErrOverBudget, Authority: p.id, Holder: holder, Wanted: bytes, Capacity: 1000}
	}
	s, _ := p.g.Authority(p.id)
	if err := p.g.SetCapacity(p.id, s.Capacity+need); err != nil {
		return err
	}
	p.pool -= need
	return nil
}

// ReturnAdmitted gives back up to n bytes of capacity still free to the
// pool, as a shared ledger takes back the claim of a failed reservation of
// n bytes.
func (p *poolAdmission) ReturnAdmitted(_ HolderID, n memapi.Bytes) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, _ := p.g.Authority(p.id)
	back := min(n, s.Free)
	if back == 0 || p.g.SetCapacity(p.id, s.Capacity-back) != nil {
		return
	}
	p.pool += back
}

func newPooled(t *testing.T) (*harness, *poolAdmission) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 0})
	h.register("kv", nil, HolderOptions{})
	p := &poolAdmission{t: t, g: h.g, id: hostA, pool: 1000}
	if err := h.g.SetAdmission(hostA, p); err != nil {
		t.Fatal(err)
	}
	return h, p
}

// Every reservation API asks the Admission for exactly the shortfall, and
// one that fits never calls it.
func TestAdmissionOnEveryPath(t *testing.T) {
	h, p := newPooled(t)
	ctx := context.Background()
	gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 300})
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	g2, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 200, Deadline: h.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("Reserve with a deadline: %v", err)
	}
	// After a cancel, a reservation that does not fit asks too.
	if err := g2.Cancel(); err != nil {
		t.Fatal(err)
	}
	g3, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 300})
	if err != nil {
		t.Fatalf("Reserve after a cancel: %v", err)
	}
	if p.calls != 3 || p.needs[0] != 300 || p.needs[1] != 200 || p.needs[2] != 100 {
		t.Fatalf("admissions %d, needs %v: want the three shortfalls", p.calls, p.needs)
	}
	_ = gr.Cancel()
	_ = g3.Cancel()
	// 600 free now: reservations that fit never ask.
	for range 100 {
		for _, sz := range []memapi.Bytes{100, 200} {
			cycle(t, h.g, hostA, "kv", sz)
		}
	}
	if p.calls != 3 {
		t.Fatalf("%d admissions for reservations that fit", p.calls)
	}
	h.wantLedger(hostA, ledger{Free: 600})
}

// An Admission that cannot raise the capacity ends a reservation that may
// not wait with its own error; one it declines proceeds as without it.
func TestAdmissionRefuses(t *testing.T) {
	h, p := newPooled(t)
	p.pool = 100
	_, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 500})
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.Op != "pool.Admit" {
		t.Fatalf("refused admission: %v, want the Admission's error", err)
	}
	// Beyond the Admission's capacity, a reservation that could wait fails at once too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 2000}); !errors.As(err, &ob) || ob.Op != "pool.Admit" {
		t.Fatalf("beyond every capacity: %v", err)
	}
	p.decline = true
	if _, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 50}); !errors.As(err, &ob) || ob.Op != "governor.Reserve" || ob.Reason != "larger than the capacity" {
		t.Fatalf("declined admission: %v, want the governor's own refusal", err)
	}
	h.wantLedger(hostA, ledger{})
	if s := h.auth(hostA); s.Waiters != 0 || s.Grants != 0 || s.OverBudget != 3 {
		t.Fatalf("after the refusals: %+v", s)
	}
}

// What the holder reserved while Admit ran counts: the retry refuses bytes
// past its limit even though the capacity now covers them.
func TestAdmissionRechecksTheLimit(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 0})
	h.register("kv", nil, HolderOptions{Limit: map[memapi.AuthorityID]memapi.Bytes{hostA: 500}})
	p := &poolAdmission{t: t, g: h.g, id: hostA, pool: 1000}
	if err := h.g.SetAdmission(hostA, p); err != nil {
		t.Fatal(err)
	}
	var other Grant
	p.during = func() {
		if err := h.g.SetCapacity(hostA, 400); err != nil {
			t.Error(err)
		}
		var err error
		if other, err = h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 400}); err != nil {
			t.Error(err)
		}
	}
	_, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 300})
	if !errors.Is(err, errOverLimit) {
		t.Fatalf("past the limit after the admission: %v, want errOverLimit", err)
	}
	if other == (Grant{}) {
		t.Fatal("the reservation made during Admit failed")
	}
	// The 300 bytes admitted for the failed reservation went back at once
	// (they stayed spare, Free 700, until something trimmed them).
	if p.pool != 1000 {
		t.Fatalf("pool %d after the failed reservation, want 1000: its 300 admitted bytes back", p.pool)
	}
	_ = other.Cancel()
	h.wantLedger(hostA, ledger{Free: 400})
}

// A reservation behind waiters that the free bytes already cover (the test
// raises the capacity under the lock without serving them) has no
// shortfall. It asked the Admission for the waiters' bytes and its own,
// all of which a shared ledger would claim for nothing. Now it asks for
// nothing: the queue is served, then the reservation.
func TestAdmissionAsksNothingWhenTheFreeBytesCoverTheQueue(t *testing.T) {
	h, p := newPooled(t)
	p.decline = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wc := make(chan Grant, 1)
	go func() {
		gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "w", Bytes: 100})
		if err != nil {
			t.Error(err)
		}
		wc <- gr
	}()
	h.awaitWaiting("kv")
	// Free bytes that cover the queue, not served yet.
	a := h.g.authority(hostA)
	a.mu.Lock()
	a.capacity += 150
	a.mu.Unlock()
	p.mu.Lock()
	p.decline = false
	calls := p.calls
	p.mu.Unlock()
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 30})
	if err != nil {
		t.Fatal(err)
	}
	w := watchdog.Recv(t, bound, "the waiting reservation", wc)
	p.mu.Lock()
	asked := p.needs[calls:]
	p.mu.Unlock()
	if len(asked) != 0 {
		t.Fatalf("asked the Admission for %v with the queue and the reservation covered", asked)
	}
	_ = gr.Cancel()
	if w != (Grant{}) {
		_ = w.Cancel()
	}
	h.wantLedger(hostA, ledger{Free: 150})
}

// stealingAdmission raises the capacity by the shortfall, and then, its
// first steals times, another holder's reservation takes those bytes before
// the reservation that asked tries again.
type stealingAdmission struct {
	g      *Governor
	id     memapi.AuthorityID
	onCall func(n int) // called with the call's number, before the capacity grows

	mu     sync.Mutex
	calls  int
	steals int
	stolen []Grant
}

func (s *stealingAdmission) Admit(_ context.Context, holder HolderID, _, need memapi.Bytes, _ int, _ bool) error {
	if holder == "thief" {
		return memapi.ErrUnavailable
	}
	s.mu.Lock()
	s.calls++
	n, steal := s.calls, s.calls <= s.steals
	s.mu.Unlock()
	if s.onCall != nil {
		s.onCall(n)
	}
	snap, _ := s.g.Authority(s.id)
	if err := s.g.SetCapacity(s.id, snap.Capacity+need); err != nil {
		return err
	}
	if steal {
		gr, err := s.g.Reserve(context.Background(), Request{Authority: s.id, Holder: "thief", Role: "t", Bytes: need})
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.stolen = append(s.stolen, gr)
		s.mu.Unlock()
	}
	return nil
}

func (s *stealingAdmission) giveBack(t *testing.T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gr := range s.stolen {
		if err := gr.Cancel(); err != nil {
			t.Error(err)
		}
	}
	s.stolen = nil
}

func newStealing(t *testing.T, steals int) (*harness, *stealingAdmission) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 0})
	h.register("kv", nil, HolderOptions{})
	h.register("thief", nil, HolderOptions{})
	s := &stealingAdmission{g: h.g, id: hostA, steals: steals}
	if err := h.g.SetAdmission(hostA, s); err != nil {
		t.Fatal(err)
	}
	return h, s
}

// While Admit raises the capacity and other reservations keep taking it, a
// reservation that may not wait tried again without end (here until the
// Admission stopped stealing, after 100 calls). Now it gives up after a
// bounded number of tries with a typed over-budget error.
func TestAdmissionRetriesAreBounded(t *testing.T) {
	h, s := newStealing(t, 100)
	_, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 50})
	var ob *OverBudgetError
	if !errors.As(err, &ob) || !errors.Is(err, memapi.ErrOverBudget) || !errors.Is(err, errAdmissionContended) || ob.Wanted != 50 {
		t.Fatalf("after %d admissions: %v, want an *OverBudgetError caused by errAdmissionContended", s.calls, err)
	}
	if s.calls != maxAdmitTries {
		t.Fatalf("%d admissions for one reservation, want maxAdmitTries (%d)", s.calls, maxAdmitTries)
	}
	if ev := h.eventsOf(EventOverBudget); len(ev) != 1 || ev[0].Holder != "kv" {
		t.Fatalf("over-budget events %+v, want the refusal's", ev)
	}
	s.giveBack(t)
	if st := h.auth(hostA); st.Reserved != 0 || st.Waiters != 0 {
		t.Fatalf("after the refusal: %+v", st)
	}
}

// A reservation that may wait stops asking once its ctx ends, and fails
// with the context's error; before, it kept asking.
func TestAdmissionRetriesEndWithTheContext(t *testing.T) {
	h, s := newStealing(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.onCall = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	_, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 50})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("after %d admissions: %v, want an over-budget error caused by context.Canceled", s.calls, err)
	}
	if s.calls != 3 {
		t.Fatalf("%d admissions, want 3: none after the context ended", s.calls)
	}
	s.giveBack(t)
}

// A reservation that may wait and whose admitted bytes keep being taken
// stops asking after the bounded tries and queues, served in arrival order
// once bytes come back.
func TestAdmissionContendedReservationQueues(t *testing.T) {
	h, s := newStealing(t, 100)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		gr  Grant
		err error
	}
	rc := make(chan result, 1)
	go func() {
		gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "r", Bytes: 50})
		rc <- result{gr, err}
	}()
	h.awaitWaiting("kv")
	s.mu.Lock()
	calls := s.calls
	s.mu.Unlock()
	if calls != maxAdmitTries {
		t.Fatalf("%d admissions before it queued, want maxAdmitTries (%d)", calls, maxAdmitTries)
	}
	s.giveBack(t)
	r := watchdog.Recv(t, bound, "the queued reservation", rc)
	if r.err != nil {
		t.Fatalf("the queued reservation: %v", r.err)
	}
	_ = r.gr.Cancel()
}

// panickyAdmission is a poolAdmission whose first Admit raises the
// capacity by half the shortfall (returning nil: the rest went to another
// reservation, as far as the governor can tell) and whose second panics.
type panickyAdmission struct {
	*poolAdmission
	n int
}

func (p *panickyAdmission) Admit(ctx context.Context, holder HolderID, bytes, need memapi.Bytes, pri int, wait bool) error {
	p.n++
	if p.n > 1 {
		panic("admission bug")
	}
	return p.poolAdmission.Admit(ctx, holder, bytes, need/2, pri, wait)
}

// TestPanickingAdmissionLeavesLedger: an Admit that panics after an earlier
// one admitted capacity for the same reservation. The bookkeeping around
// the call is deferred: the capacity admitted goes back (ReturnAdmitted)
// and the authority's figures are what they were, the lock is free, and
// the panic reaches the caller, as a panicking hook's does.
func TestPanickingAdmissionLeavesLedger(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1 << 20})
	h.register("kv", nil, HolderOptions{})
	p := &panickyAdmission{poolAdmission: &poolAdmission{t: t, g: h.g, id: hostA, pool: 4 << 20}}
	if err := h.g.SetAdmission(hostA, p); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	full, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	before := h.auth(hostA)
	var recovered any
	watchdog.Within(t, 5*time.Second, "Reserve with a panicking Admission", func() {
		defer func() { recovered = recover() }()
		_, _ = h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 1 << 20})
	})
	if recovered != "admission bug" {
		t.Fatalf("recovered %v, want the Admission's panic", recovered)
	}
	if p.n != 2 {
		t.Fatalf("Admit called %d times, want 2", p.n)
	}
	var after AuthoritySnapshot
	watchdog.Within(t, 5*time.Second, "a snapshot after the panic (the authority's lock left held?)", func() { after = h.auth(hostA) })
	if after.Capacity != before.Capacity || after.Reserved != before.Reserved || after.Free != before.Free {
		t.Fatalf("capacity %d reserved %d free %d after the panic, want %d %d %d",
			after.Capacity, after.Reserved, after.Free, before.Capacity, before.Reserved, before.Free)
	}
	if p.pool != 4<<20 {
		t.Fatalf("the admission's pool holds %d, want it all back", p.pool)
	}
	if !after.Balanced() {
		t.Fatalf("unbalanced %+v", after)
	}
	if err := full.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1 << 20})
}
