package governor

import (
	"context"
	"reflect"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// copyGrant returns a copy of *gr, as `cp := *gr` makes one (written with
// reflect so that go vet's copylocks, which flags that statement, leaves
// this test alone).
func copyGrant(gr *Grant) *Grant {
	cp := reflect.New(reflect.TypeFor[Grant]())
	cp.Elem().Set(reflect.ValueOf(gr).Elem())
	return cp.Interface().(*Grant)
}

// TestCopiedGrantRefused: a copy of an issued Grant is not a grant. Every
// method that can fail refuses it with ErrCopiedGrant (a
// memapi.ErrForeignGrant) and changes nothing; the others report it
// closed; the issuer check refuses it, so the checked wrapper draws
// nothing from it. The original goes on as if no copy was made, and the
// ledger stays exact; once its use ended, the governor issues it again,
// and the copy is still refused.
func TestCopiedGrantRefused(t *testing.T) {
	const capacity = 1 << 20
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: capacity})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()
	gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	cp := copyGrant(gr)
	before := h.ledger(hostA)

	mustKind(t, cp.Cancel(), ErrCopiedGrant)
	mustKind(t, cp.Cancel(), memapi.ErrForeignGrant)
	mustKind(t, cp.Draw(1), ErrCopiedGrant)
	mustKind(t, cp.Undraw(0), ErrCopiedGrant)
	mustKind(t, cp.Refund(0), ErrCopiedGrant)
	if l, err := cp.Commit(); l != nil || err == nil {
		t.Fatalf("Commit of a copy: %v, %v", l, err)
	} else {
		mustKind(t, err, ErrCopiedGrant)
	}
	if cp.Open() || cp.Remaining() != 0 || cp.Drawn() != 0 {
		t.Fatalf("a copy reads open %v, remaining %d, drawn %d", cp.Open(), cp.Remaining(), cp.Drawn())
	}
	if h.g.IssuedGrant(cp) || h.g.IssuedAccount(cp) {
		t.Fatal("the issuer check vouched for a copy")
	}
	h.wantLedger(hostA, before)

	// The checked wrapper draws nothing from the copy.
	mech := fakes.NewMechanism(fakes.Config{Authority: hostA})
	m := checked.Wrap(mech, h.g)
	if _, err := m.Allocate(ctx, memapi.AllocRequest{Size: 64 << 10}, cp); err == nil {
		t.Fatal("the checked wrapper allocated against a copy")
	} else {
		mustKind(t, err, memapi.ErrForeignGrant)
	}
	if n := mech.UsedBytes(); n != 0 {
		t.Fatalf("the mechanism holds %d bytes drawn from a copy", n)
	}
	h.wantLedger(hostA, before)

	// The original is untouched: it draws, undraws and cancels; then the
	// whole capacity is free, and a reservation of all of it fits.
	a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 64 << 10}, gr)
	if err != nil {
		t.Fatal(err)
	}
	if gr.Drawn() != 64<<10 {
		t.Fatalf("drawn %d", gr.Drawn())
	}
	if err := m.Free(ctx, a, gr); err != nil {
		t.Fatal(err)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	mustKind(t, cp.Cancel(), ErrCopiedGrant)
	h.wantLedger(hostA, ledger{Free: capacity})
	all, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: capacity})
	if err != nil {
		t.Fatal(err)
	}
	mustKind(t, cp.Cancel(), ErrCopiedGrant)
	mustKind(t, cp.Draw(1), ErrCopiedGrant)
	if h.g.IssuedGrant(cp) {
		t.Fatal("the issuer check vouched for a copy of a reissued grant")
	}
	if err := all.Cancel(); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: capacity})
}

// TestCopiedZeroGrantStaysUnissued: a copy of a zero Grant is a zero
// Grant, closed to every use like the original.
func TestCopiedZeroGrantStaysUnissued(t *testing.T) {
	var zero Grant
	cp := copyGrant(&zero)
	for _, gr := range []*Grant{&zero, cp} {
		mustKind(t, gr.Draw(1), memapi.ErrGrantClosed)
		mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
		if _, err := gr.Commit(); err == nil {
			t.Fatal("a zero Grant committed")
		}
	}
}

// TestCopiedLeaseNotVouched: a copy of a lease is not an account of the
// governor: the checked wrapper refunds nothing to it.
func TestCopiedLeaseNotVouched(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: 1000})
	h.register("kv", nil, HolderOptions{})
	gr, err := h.g.Reserve(context.Background(), Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(100); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	cp := *l
	if !h.g.IssuedAccount(l) || h.g.IssuedAccount(&cp) {
		t.Fatalf("IssuedAccount: lease %v, its copy %v", h.g.IssuedAccount(l), h.g.IssuedAccount(&cp))
	}
	if err := l.Refund(100); err != nil {
		t.Fatal(err)
	}
	h.wantLedger(hostA, ledger{Free: 1000})
}
