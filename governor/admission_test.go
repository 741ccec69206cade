package governor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
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

func (p *poolAdmission) Admit(_ context.Context, holder HolderID, bytes, need memapi.Bytes, _ Priority, _ bool) error {
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
		return ErrNoAdmission
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
	gr, err := h.g.Reserve(ctx, hostA, "kv", "r", 300, 0, time.Time{})
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	bd := mustBind(t, h.g, hostA, "kv")
	g2, err := bd.Reserve(ctx, 200, 0, time.Time{})
	if err != nil {
		t.Fatalf("Binding.Reserve: %v", err)
	}
	var g3 Grant
	if err := bd.ReserveInto(ctx, &g3, 100, 0, time.Time{}); err != nil {
		t.Fatalf("Binding.ReserveInto: %v", err)
	}
	if p.calls != 3 || p.needs[0] != 300 || p.needs[1] != 200 || p.needs[2] != 100 {
		t.Fatalf("admissions %d, needs %v: want the three shortfalls", p.calls, p.needs)
	}
	_ = gr.Cancel()
	_ = g2.Cancel()
	_ = g3.Cancel()
	// 600 free now: reservations that fit never ask, and allocate nothing.
	var g4 Grant
	n := testing.AllocsPerRun(100, func() {
		for _, sz := range []memapi.Bytes{100, 200} {
			cycle(t, bd, &g4, sz)
		}
	})
	if n != 0 && !raceEnabled {
		t.Fatalf("%v allocations per cycle that fits", n)
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
	_, err := h.g.Reserve(context.Background(), hostA, "kv", "r", 500, 0, time.Time{})
	var ob *OverBudgetError
	if !errors.As(err, &ob) || ob.Op != "pool.Admit" {
		t.Fatalf("refused admission: %v, want the Admission's error", err)
	}
	// Beyond the Admission's capacity, a reservation that could wait fails at once too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := h.g.Reserve(ctx, hostA, "kv", "r", 2000, 0, time.Time{}); !errors.As(err, &ob) || ob.Op != "pool.Admit" {
		t.Fatalf("beyond every capacity: %v", err)
	}
	p.decline = true
	if _, err := h.g.Reserve(context.Background(), hostA, "kv", "r", 50, 0, time.Time{}); !errors.As(err, &ob) || ob.Op != "governor.Reserve" || ob.Reason != "larger than the capacity" {
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
	var other *Grant
	p.during = func() {
		if err := h.g.SetCapacity(hostA, 400); err != nil {
			t.Error(err)
		}
		var err error
		if other, err = h.g.Reserve(context.Background(), hostA, "kv", "r", 400, 0, time.Time{}); err != nil {
			t.Error(err)
		}
	}
	_, err := h.g.Reserve(context.Background(), hostA, "kv", "r", 300, 0, time.Time{})
	if !errors.Is(err, ErrOverLimit) {
		t.Fatalf("past the limit after the admission: %v, want ErrOverLimit", err)
	}
	if other == nil {
		t.Fatal("the reservation made during Admit failed")
	}
	_ = other.Cancel()
	h.wantLedger(hostA, ledger{Free: 700})
}

// A reservation behind waiters that the free bytes already cover (a settle
// booked a refund without serving them; the refunder serves them next) has
// no shortfall. It asked the Admission for the waiters' bytes and its own,
// all of which a shared ledger would claim for nothing. Now it asks for
// nothing: the queue is served, then the reservation.
func TestAdmissionAsksNothingWhenTheFreeBytesCoverTheQueue(t *testing.T) {
	h, p := newPooled(t)
	p.decline = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wc := make(chan *Grant, 1)
	go func() {
		gr, err := h.g.Reserve(ctx, hostA, "kv", "w", 100, 0, time.Time{})
		if err != nil {
			t.Error(err)
		}
		wc <- gr
	}()
	h.awaitWaiting("kv")
	// What a settle that books a refund without serving leaves.
	a := h.g.authority(hostA)
	a.mu.Lock()
	a.capacity += 150
	a.mu.Unlock()
	p.mu.Lock()
	p.decline = false
	calls := p.calls
	p.mu.Unlock()
	gr, err := h.g.Reserve(context.Background(), hostA, "kv", "r", 30, 0, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	w := <-wc
	p.mu.Lock()
	asked := p.needs[calls:]
	p.mu.Unlock()
	if len(asked) != 0 {
		t.Fatalf("asked the Admission for %v with the queue and the reservation covered", asked)
	}
	_ = gr.Cancel()
	if w != nil {
		_ = w.Cancel()
	}
	h.wantLedger(hostA, ledger{Free: 150})
}
