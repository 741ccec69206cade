package governor

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

// The accounts the governor issues over its leases are its own: vouched
// for when every account they forward to is this governor's, refused
// otherwise; and they refund what they say.
func TestIssuedAccounts(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	other := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	other.register("kv", nil, HolderOptions{})
	l1, l2 := h.lease(hostA, "kv", 100), h.lease(hostA, "kv", 200)
	foreign := other.lease(hostA, "kv", 50)

	q := l1.QuarantinedAccount()
	split := h.g.Split(hostA, []Part{{l1, 100}, {l2, 200}})
	zero := h.g.Split(hostA, nil)
	for name, a := range map[string]memapi.Account{"quarantined": q, "split": split, "zero": zero} {
		if !vouched(h.g.Ledger().IssuedAccount(a)) {
			t.Errorf("%s: not vouched for by its governor", name)
		}
		if vouched(other.g.Ledger().IssuedAccount(a)) {
			t.Errorf("%s: vouched for by another governor", name)
		}
		if a.Authority() != hostA {
			t.Errorf("%s: authority %s", name, a.Authority())
		}
	}
	if vouched(h.g.Ledger().IssuedAccount(h.g.Split(hostA, []Part{{l1, 100}, {foreign, 50}}))) {
		t.Error("a split over another governor's lease was vouched for")
	}
	if vouched(h.g.Ledger().IssuedAccount(foreign.QuarantinedAccount())) {
		t.Error("the quarantined account of another governor's lease was vouched for")
	}

	// The quarantined account refunds quarantined bytes only.
	if err := l1.Quarantine(40); err != nil {
		t.Fatal(err)
	}
	mustKind(t, q.Refund(41), errOverReturn)
	if err := q.Refund(40); err != nil {
		t.Fatal(err)
	}
	if l1.quarantined() != 0 || l1.charged() != 60 {
		t.Fatalf("after the quarantined refund: quarantined %d charged %d", l1.quarantined(), l1.charged())
	}
	// The split refunds its parts in order, each up to its bytes.
	if err := h.g.Split(hostA, []Part{{l1, 60}, {l2, 200}}).Refund(100); err != nil {
		t.Fatal(err)
	}
	if l1.Bytes() != 0 || l2.Bytes() != 160 {
		t.Fatalf("after the split refund: %d, %d", l1.Bytes(), l2.Bytes())
	}
	mustKind(t, h.g.Split(hostA, []Part{{l2, 100}}).Refund(101), memapi.ErrInvalidSize)
	if l2.Bytes() != 60 {
		t.Fatalf("the split refunded %d of its part", 160-l2.Bytes())
	}
	// The zero account takes a refund of nothing and reports any other.
	if err := zero.Refund(0); err != nil {
		t.Fatal(err)
	}
	mustKind(t, zero.Refund(1), memapi.ErrInvalidSize)
	l2.release()
	foreign.release()
	h.wantLedger(hostA, ledger{Free: 1000})
}

// The reservation's deadline bounds its Admission's waits as its ctx
// does: an Admission that waits on its ctx returns at the deadline.
func TestAdmissionEndsAtTheDeadline(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 0})
	h.register("kv", nil, HolderOptions{})
	called := make(chan struct{}, 1)
	adm := admitFunc(func(ctx context.Context) error {
		called <- struct{}{}
		<-ctx.Done()
		return &OverBudgetError{Op: "test.Admit", Kind: memapi.ErrOverBudget, Authority: hostA, Wanted: 10, Err: context.Cause(ctx)}
	})
	if err := h.g.SetAdmission(hostA, adm); err != nil {
		t.Fatal(err)
	}
	done := h.reserveAsync(context.Background(), hostA, "kv", 10, 0, h.clock.Now().Add(time.Second))
	watchdog.Recv(t, bound, "the Admission's call", called)
	h.clock.Advance(time.Second)
	r := await(t, done)
	mustKind(t, r.err, context.DeadlineExceeded)
	h.wantLedger(hostA, ledger{})
}

// admitFunc is an Admission that runs f.
type admitFunc func(ctx context.Context) error

func (f admitFunc) Admit(ctx context.Context, _ HolderID, _, _ memapi.Bytes, _ int, _ bool) error {
	return f(ctx)
}

// A split of one authority refuses a part of another, whole: a release on
// authority A never refunds B's lease (which would leave A's lease charging
// freed memory), and the checked wrapper is not told it is the governor's.
func TestSplitRefusesAnotherAuthoritysPart(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000, hostB: 1000})
	h.register("kv", nil, HolderOptions{})
	la, lb := h.lease(hostA, "kv", 100), h.lease(hostB, "kv", 100)
	for name, parts := range map[string][]Part{
		"another authority's lease": {{la, 50}, {lb, 100}},
		"a nil account":             {{la, 50}, {nil, 100}},
	} {
		split := h.g.Split(hostA, parts)
		if vouched(h.g.Ledger().IssuedAccount(split)) {
			t.Errorf("%s: the split is vouched for", name)
		}
		mustKind(t, split.Refund(120), memapi.ErrAuthorityMismatch)
		if la.Bytes() != 100 || lb.Bytes() != 100 {
			t.Fatalf("%s: the refused split refunded: A's lease %d, B's %d, want 100 and 100", name, la.Bytes(), lb.Bytes())
		}
	}
}

// vouched is whether the governor vouched for an account or a grant
// (IssuedAccount, IssuedGrant), whatever its authority.
func vouched(_ memapi.AuthorityID, ok bool) bool { return ok }

// A refund takes a lease's pending bytes first, then its charged bytes
// not quarantined, then quarantined ones; the lease's own numbers and its
// authority's move alike, so a lease emptied by refunds holds nothing
// quarantined and a new quarantine is refused.
func TestRefundOrderOverQuarantinedBytes(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	l := h.lease(hostA, "kv", 100)
	if err := l.Quarantine(30); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkPending(50); err != nil {
		t.Fatal(err)
	}
	check := func(step string, charged, pending, quarantined memapi.Bytes) {
		t.Helper()
		a := h.auth(hostA)
		if l.charged() != charged || l.pending() != pending || l.quarantined() != quarantined ||
			a.Charged != charged || a.Pending != pending || a.Quarantined != quarantined {
			t.Fatalf("%s: lease c%d p%d q%d, authority c%d p%d q%d; want c%d p%d q%d", step,
				l.charged(), l.pending(), l.quarantined(), a.Charged, a.Pending, a.Quarantined, charged, pending, quarantined)
		}
	}
	check("marked", 50, 50, 30)
	if err := l.Refund(60); err != nil { // 50 pending, then 10 charged
		t.Fatal(err)
	}
	check("first refund", 40, 0, 30)
	if err := l.Refund(25); err != nil { // 10 not quarantined, then 15 quarantined
		t.Fatal(err)
	}
	check("second refund", 15, 0, 15)
	mustKind(t, l.Quarantine(1), errOverReturn)
	if err := l.Refund(15); err != nil {
		t.Fatal(err)
	}
	check("emptied", 0, 0, 0)
	if a := h.auth(hostA); a.Leases != 0 || a.Free != 1000 {
		t.Fatalf("emptied lease: %d leases, %d free", a.Leases, a.Free)
	}
}
