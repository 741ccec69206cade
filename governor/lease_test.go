package governor

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

func TestLeasePendingThenRefund(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	l := h.lease(hostA, "kv", 600)
	h.wantLedger(hostA, ledger{Charged: 600, Free: 400})

	if err := l.MarkPending(250); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Charged: 350, Pending: 250, Free: 400})
	err := l.MarkPending(351)
	mustKind(t, err, errOverReturn)
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != 351 || me.Available != 350 {
		t.Fatalf("figures %#v", me)
	}

	// Refund takes from pending first.
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Charged: 350, Pending: 150, Free: 500})
	if err := l.Refund(200); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Charged: 300, Free: 700})
	mustKind(t, l.Refund(301), errOverReturn)
	h.wantLedger(hostA, ledger{Charged: 300, Free: 700})

	if n := l.release(); n != 300 {
		t.Fatalf("release returned %d", n)
	}
	if n := l.release(); n != 0 {
		t.Fatalf("second release returned %d", n)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
	mustKind(t, l.Refund(1), errOverReturn)
}

func TestLeaseAndGrantAreLedgerInterfaces(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 100})
	h.register("x", nil, HolderOptions{})
	var acct memapi.Account = h.lease(hostA, "x", 40)
	if acct.Authority() != hostA {
		t.Fatal(acct.Authority())
	}
	if err := acct.Refund(40); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 100})
}
