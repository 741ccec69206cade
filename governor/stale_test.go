package governor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// The governor recycles a grant once its use ended; the handles of the
// ended issue are stale from the reissue on. These tests end a use, let
// the next reservation take the same record (both ways: without the lock,
// same holder and size, and under it, another size), then use the stale
// handle: it is refused with ErrStaleHandle and the new holder's grant,
// lease and the ledger are exactly as they were.

// reissued reports whether x is a new issue of the record of old, and
// skips when the race detector's sync.Pool dropped it (the test then has
// nothing to check).
func reissued(t *testing.T, old, x Grant) {
	t.Helper()
	if sameRecord(old, x) {
		return
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool dropped the spare grant")
	}
	t.Fatal("Reserve did not issue the spare grant again")
}

func mustStale(t *testing.T, err error) {
	t.Helper()
	mustKind(t, err, memapi.ErrGrantClosed)
	mustKind(t, err, ErrStaleHandle)
}

// staleSizes: the same size issues the spare grant again without the lock
// (its lease was refunded whole), another size under it.
var staleSizes = []memapi.Bytes{100, 200}

func TestStaleGrantCancelRefused(t *testing.T) {
	for _, n := range staleSizes {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
		h.register("kv", nil, HolderOptions{})
		gr := reserve(t, h.g, hostA, "kv", 100)
		if err := gr.Cancel(); err != nil {
			t.Fatal(err)
		}
		x := reserve(t, h.g, hostA, "kv", n)
		reissued(t, gr, x)
		mustStale(t, gr.Cancel())
		if !x.Open() || x.Remaining() != n {
			t.Fatalf("size %d: the stale Cancel closed the new issue: open %v remaining %d", n, x.Open(), x.Remaining())
		}
		h.wantLedger(hostA, ledger{Reserved: n, Free: 1000 - n})
		mustStale(t, gr.Draw(1))
		_, err := gr.Commit()
		mustStale(t, err)
		if x.Drawn() != 0 {
			t.Fatalf("size %d: the stale Draw drew %d from the new issue", n, x.Drawn())
		}
		if err := x.Cancel(); err != nil {
			t.Fatal(err)
		}
		h.wantLedger(hostA, ledger{Free: 1000})
	}
}

// spentLease commits and refunds a lease of 100 bytes: its use ended.
func spentLease(t *testing.T, h *harness) (Grant, Lease) {
	t.Helper()
	gr := reserve(t, h.g, hostA, "kv", 100)
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	return gr, l
}

// committed reserves n bytes, expecting the record of old, and commits them.
func committed(t *testing.T, h *harness, old Grant, n memapi.Bytes) Lease {
	t.Helper()
	x := reserve(t, h.g, hostA, "kv", n)
	reissued(t, old, x)
	if err := x.Draw(n); err != nil {
		t.Fatal(err)
	}
	xl, err := x.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return xl
}

func TestStaleLeaseRefundRefused(t *testing.T) {
	for _, n := range staleSizes {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
		h.register("kv", nil, HolderOptions{})
		gr, l := spentLease(t, h)
		xl := committed(t, h, gr, n)
		mustStale(t, l.Refund(n))
		if xl.Charged() != n {
			t.Fatalf("size %d: the stale Refund took from the new lease: charged %d", n, xl.Charged())
		}
		h.wantLedger(hostA, ledger{Charged: n, Free: 1000 - n})
		mustStale(t, l.MarkPending(1))
		if got := l.Release(); got != 0 {
			t.Fatalf("size %d: a stale Release returned %d", n, got)
		}
		if l.Charged() != 0 || l.Bytes() != 0 {
			t.Fatal("a stale lease reads the new lease's figures")
		}
		h.wantLedger(hostA, ledger{Charged: n, Free: 1000 - n})
		if err := xl.Refund(n); err != nil {
			t.Fatal(err)
		}
		h.wantLedger(hostA, ledger{Free: 1000})
	}
}

func TestStaleLeaseQuarantineRefused(t *testing.T) {
	for _, n := range staleSizes {
		h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
		h.register("kv", nil, HolderOptions{})
		gr, l := spentLease(t, h)
		xl := committed(t, h, gr, n)
		mustStale(t, l.Quarantine(50))
		if q := xl.Quarantined(); q != 0 {
			t.Fatalf("size %d: the stale Quarantine booked %d of the new lease", n, q)
		}
		if s := h.auth(hostA); s.Quarantined != 0 {
			t.Fatalf("size %d: quarantined %d after a stale Quarantine", n, s.Quarantined)
		}
		// The same through the account a retry refunds to.
		if err := xl.Quarantine(50); err != nil {
			t.Fatal(err)
		}
		mustStale(t, l.RefundQuarantined(50))
		mustStale(t, l.QuarantinedAccount().Refund(50))
		if q := xl.Quarantined(); q != 50 {
			t.Fatalf("size %d: the stale RefundQuarantined took from the new lease: %d left", n, q)
		}
		h.wantLedger(hostA, ledger{Charged: n, Free: 1000 - n})
		if err := xl.RefundQuarantined(50); err != nil {
			t.Fatal(err)
		}
		if err := xl.Refund(n - 50); err != nil {
			t.Fatal(err)
		}
		h.wantLedger(hostA, ledger{Free: 1000})
	}
}

// Stale handles used while other goroutines keep issuing their records
// again: every use is refused or changes nothing it does not own, and when
// all is done the ledger is exact. Under the race detector this also shows
// that a stale handle reads nothing of the record that a reissue writes
// without its synchronization.
func TestStaleHandlesRacingReissues(t *testing.T) {
	const workers, rounds = 2, 2000
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1 << 20})
	h.register("kv", nil, HolderOptions{})
	h.register("w", nil, HolderOptions{})
	// The stale handles: grants cancelled and leases refunded whole.
	var staleGrants []Grant
	var staleLeases []Lease
	for range 8 {
		gr := reserve(t, h.g, hostA, "kv", 100)
		if err := gr.Cancel(); err != nil {
			t.Fatal(err)
		}
		staleGrants = append(staleGrants, gr)
		g2, l := spentLease(t, h)
		staleGrants = append(staleGrants, g2)
		staleLeases = append(staleLeases, l)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := HolderID([]string{"kv", "w"}[w%2])
			for i := range rounds {
				n := memapi.Bytes(100 * (1 + i%2)) // the same size (lock-free reissue) and another
				gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: holder, Role: "test", Bytes: n})
				if err != nil {
					errs <- err
					return
				}
				if err := gr.Draw(n); err != nil {
					errs <- err
					return
				}
				l, err := gr.Commit()
				if err != nil {
					errs <- err
					return
				}
				if err := l.Quarantine(1); err != nil {
					errs <- err
					return
				}
				if err := l.RefundQuarantined(1); err != nil {
					errs <- err
					return
				}
				if err := l.Refund(n - 1); err != nil {
					errs <- fmt.Errorf("the owner's refund of its lease: %w", err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range rounds {
			gr := staleGrants[i%len(staleGrants)]
			l := staleLeases[i%len(staleLeases)]
			// (A Cancel of a cancelled grant not issued again is a no-op:
			// the ledger at the end shows it changed nothing either way.)
			_ = gr.Cancel()
			for _, err := range []error{gr.Draw(1), gr.Undraw(0), l.Refund(100), l.Quarantine(1), l.MarkPending(1), l.RefundQuarantined(1)} {
				if err == nil {
					errs <- fmt.Errorf("round %d: a stale handle's use succeeded", i)
					return
				}
			}
			if _, err := gr.Commit(); err == nil {
				errs <- fmt.Errorf("round %d: a stale grant committed", i)
				return
			}
			if n := l.Release(); n != 0 {
				errs <- fmt.Errorf("round %d: a stale lease released %d", i, n)
				return
			}
			_ = l.Bytes() + l.Charged() + gr.Drawn() + gr.Remaining()
			// The getters of a stale handle read nothing its record's next
			// issue writes (under -race, a read racing the reissue fails),
			// and answer with the zero value once the record was issued
			// again.
			if hd, r, p := gr.Holder(), gr.Role(), gr.Priority(); hd != "" && (hd != "kv" || r != "test" && r != "" || p != 0) {
				errs <- fmt.Errorf("round %d: a stale grant reads as holder %q, role %q, priority %d", i, hd, r, p)
				return
			}
			if hd, r := l.Holder(), l.Role(); hd != "" && (hd != "kv" || r != "test" && r != "") {
				errs <- fmt.Errorf("round %d: a stale lease reads as holder %q, role %q", i, hd, r)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	h.wantLedger(hostA, ledger{Free: 1 << 20})
}

// sameRecord reports whether two grants are issues of one recycled record.
func sameRecord(a, b Grant) bool { return a.g == b.g }

// TestStaleGetterRacingReissue reads ended grants' getters without pause
// while their records are issued again, under the lock, to another holder,
// role and priority, round after round: the getters never read a record
// while an issue writes it (under -race, a getter that skipped the
// authority's lock is reported here), and a stale handle answers with its
// own issue's figures or, once the record was issued again, the zero
// value: never the next owner's.
func TestStaleGetterRacingReissue(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1 << 20})
	h.register("kv", nil, HolderOptions{})
	h.register("w", nil, HolderOptions{})
	type issue struct {
		gr     Grant
		holder HolderID
		role   Role
		pri    Priority
	}
	var published atomic.Pointer[[]issue]
	published.Store(new([]issue))
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			for _, is := range *published.Load() {
				hd, r, p := is.gr.Holder(), is.gr.Role(), is.gr.Priority()
				// Each getter answers alone: its issue's figure, or zero
				// once the record was issued again.
				if hd != "" && hd != is.holder || r != "" && r != is.role || p != 0 && p != is.pri {
					done <- fmt.Errorf("a stale grant of %s/%s/%d reads holder %q, role %q, priority %d", is.holder, is.role, is.pri, hd, r, p)
					return
				}
			}
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
		}
	}()
	reissued := 0
	var last []issue
	for round := range 3000 {
		// Each round reserves under another holder, role and priority than
		// the last, so every record it takes is issued under the lock.
		holder, role, pri := HolderID("kv"), Role("even"), Priority(0)
		if round%2 == 1 {
			holder, role, pri = "w", "odd", 3
		}
		ended := make([]issue, 4)
		for i := range ended {
			gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: holder, Role: role, Bytes: 100, Priority: pri})
			if err != nil {
				t.Fatal(err)
			}
			for _, is := range last {
				if sameRecord(gr, is.gr) {
					reissued++
				}
			}
			ended[i] = issue{gr, holder, role, pri}
		}
		for _, is := range ended {
			if err := is.gr.Cancel(); err != nil {
				t.Fatal(err)
			}
		}
		published.Store(&ended)
		last = ended
	}
	close(stop)
	if err := <-done; err != nil {
		t.Error(err)
	}
	if reissued == 0 {
		t.Fatal("no ended grant's record was issued again in 3000 rounds")
	}
	for _, is := range last {
		if hd, r, p := is.gr.Holder(), is.gr.Role(), is.gr.Priority(); hd != is.holder || r != is.role || p != is.pri {
			t.Errorf("an ended grant not issued again reads holder %q, role %q, priority %d, want its own %s/%s/%d", hd, r, p, is.holder, is.role, is.pri)
		}
	}
	h.wantLedger(hostA, ledger{Free: 1 << 20})
}
