package governor

import (
	"context"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// A reservation of the same size as the slot's refunded grant issues it
// again in one swap, and only then compares the holder, role and priority
// (which nothing can write once the swap made the record its own). When
// they differ, the record goes back under the lock as it was, a grant
// refunded whole, and the reservation takes it from the spare list under
// the lock: the ledger, the count of grants made and the stale handles are
// as if the swap had never happened.
func TestReissueComparesAfterItsSwap(t *testing.T) {
	for _, c := range []struct {
		name string
		req  Request
	}{
		{"holder", Request{Authority: hostA, Holder: "w", Role: "test", Bytes: 100}},
		{"role", Request{Authority: hostA, Holder: "kv", Role: "pages", Bytes: 100}},
		{"priority", Request{Authority: hostA, Holder: "kv", Role: "test", Bytes: 100, Priority: 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
			h.register("kv", nil, HolderOptions{})
			h.register("w", nil, HolderOptions{})
			old := cycle(t, h.g, hostA, "kv", 100) // the slot's grant, refunded
			gr, err := h.g.Reserve(context.Background(), c.req)
			if err != nil {
				t.Fatal(err)
			}
			if gr.g != old.g {
				t.Fatal("the reservation did not take the record it gave back")
			}
			if gr.Holder() != c.req.Holder || gr.Role() != c.req.Role || gr.Priority() != c.req.Priority || gr.Size() != 100 || !gr.Open() {
				t.Fatalf("grant %s %s %d %d open %v", gr.Holder(), gr.Role(), gr.Priority(), gr.Size(), gr.Open())
			}
			mustStale(t, old.Cancel())
			mustStale(t, Lease(old).Refund(100))
			h.wantLedger(hostA, ledger{Reserved: 100, Free: 900})
			if err := gr.Cancel(); err != nil {
				t.Fatal(err)
			}
			h.wantLedger(hostA, ledger{Free: 1000})
			if s := h.auth(hostA); s.Granted != 2 || s.Grants != 0 || s.Leases != 0 {
				t.Fatalf("after the reservation: %+v", s)
			}
			if s := h.g.Snapshot(); holderFigures(s, "kv").Reserved != 0 || holderFigures(s, "w").Reserved != 0 {
				t.Fatalf("holders after the reservation: %+v", s.Holders)
			}
		})
	}
}

// holderFigures returns holder id's figures on hostA in s.
func holderFigures(s Snapshot, id HolderID) HolderAuthoritySnapshot {
	for _, hs := range s.Holders {
		if hs.ID == id {
			for _, ha := range hs.Authorities {
				if ha.Authority == hostA {
					return ha
				}
			}
		}
	}
	return HolderAuthoritySnapshot{}
}

// closeBetweenPlaceAndSwap makes the next refund without the lock close
// the governor after it chose where to leave its grant and before its swap:
// the refund lands after Close's settle, on a grant that was open at Close.
func closeBetweenPlaceAndSwap(t *testing.T, g *Governor) {
	refundChecked = func() {
		refundChecked = nil
		g.Close()
	}
	t.Cleanup(func() { refundChecked = nil })
}

// Nothing is issued again without the lock after Close, even a grant open
// at Close whose lease is refunded whole without the lock afterwards, racing
// Close: the slot holds closedHint, which nothing issues and where no refund
// leaves its grant, and the pool is not read once the authority is closed.
func TestNoReissueAfterClose(t *testing.T) {
	for _, c := range []struct {
		name    string
		pooled  bool // the slot holds pooledHint: the refund leaves its grant in the pool
		closeAt func(t *testing.T, g *Governor)
	}{
		{"slot, closed before the refund", false, func(t *testing.T, g *Governor) { g.Close() }},
		{"slot, closed during the refund", false, closeBetweenPlaceAndSwap},
		{"pool, closed during the refund", true, closeBetweenPlaceAndSwap},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
			h.register("kv", nil, HolderOptions{})
			a := h.g.authority(hostA)
			gr := reserve(t, h.g, hostA, "kv", 100)
			if c.pooled {
				a.hints.slot.Store(&pooledHint)
			}
			if err := gr.Draw(100); err != nil {
				t.Fatal(err)
			}
			l, err := gr.Commit() // without the lock
			if err != nil {
				t.Fatal(err)
			}
			c.closeAt(t, h.g)
			if err := l.Refund(100); err != nil {
				t.Fatal(err)
			}
			if _, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "test", Bytes: 100}); err == nil {
				t.Fatal("a grant was issued again after Close")
			}
			if next := a.hints.pool.Get(); next != nil {
				// Left there by the refund that raced Close: still
				// refunded, and never issued.
				if x, _ := next.(*grant); x != gr.g || x.state.Load()>>stateShift != stateRefunded {
					t.Fatalf("the pool holds %p in state %d", x, x.state.Load()>>stateShift)
				}
			}
		})
	}
}

// Two streams at once on an authority: the second reservation finds the
// slot's grant in use, the slot becomes pooledHint, and refunded grants go
// to the pool (kept per P) rather than the slot, where Reserve finds them.
// The ledger is exact throughout.
func TestStreamsAtOnceTakeGrantsFromThePool(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	a := h.g.authority(hostA)
	cycle(t, h.g, hostA, "kv", 100) // the slot's grant, refunded
	x1 := reserve(t, h.g, hostA, "kv", 100)
	if a.hints.slot.Load() != x1.g {
		t.Fatal("the first reservation did not take the slot's grant")
	}
	x2 := reserve(t, h.g, hostA, "kv", 100) // x1 in use: another stream
	if a.hints.slot.Load() != &pooledHint {
		t.Fatal("the slot's grant in use did not make the slot pooledHint")
	}
	h.wantLedger(hostA, ledger{Reserved: 200, Free: 800})
	spend(t, x1, 100)
	spend(t, x2, 100)
	if a.hints.slot.Load() != &pooledHint {
		t.Fatal("a refund left its grant in the slot while streams run at once")
	}
	x3 := reserve(t, h.g, hostA, "kv", 100)
	if !raceEnabled && x3.g != x1.g && x3.g != x2.g { // (the race detector's sync.Pool drops a share)
		t.Fatal("the reservation did not take a refunded grant from the pool")
	}
	h.wantLedger(hostA, ledger{Reserved: 100, Free: 900})
	if err := x3.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
	if s := h.auth(hostA); s.Granted != 4 || s.Grants != 0 || s.Leases != 0 {
		t.Fatalf("after the streams: %+v", s)
	}

	// One stream again: once a grant of the pool was issued as often as
	// its word counts, the lock issues it, and the slot is tried again.
	if raceEnabled {
		return // (the race detector's sync.Pool drops a share of the grants)
	}
	for range genMax + 2 {
		cycle(t, h.g, hostA, "kv", 100)
	}
	if gr := a.hints.slot.Load(); gr == nil || gr == &pooledHint {
		t.Fatal("a single stream did not get the slot back")
	}
	h.wantLedger(hostA, ledger{Free: 1000})
}

// A refund whose swap lands before Close's settle and whose grant is kept
// in the hints after Close: the slot stays closed (keep never stores over
// closedHint), so a grant open at Close and refunded afterwards takes the
// lock, and nothing is issued again after Close.
func TestCloseBetweenARefundsSwapAndItsKeep(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	a := h.g.authority(hostA)
	first := h.lease(hostA, "kv", 100)        // committed without the lock
	open := reserve(t, h.g, hostA, "kv", 100) // open at Close
	refundSwapped = func() {
		refundSwapped = nil
		h.g.Close()
	}
	t.Cleanup(func() { refundSwapped = nil })
	if n := first.Release(); n != 100 { // refundUnsettled: swap, Close, keep
		t.Fatalf("released %d", n)
	}
	if a.hints.slot.Load() != &closedHint {
		t.Fatal("the slot is not closed after Close")
	}
	spend(t, open, 100)
	if _, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "test", Bytes: 100}); err == nil {
		t.Fatal("a grant was issued again after Close")
	}
	for {
		x, _ := a.hints.pool.Get().(*grant)
		if x == nil {
			break
		}
		if x.state.Load()>>stateShift == stateRefunded {
			t.Fatalf("a refunded grant (%p) waits in the pool after Close", x)
		}
	}
}
