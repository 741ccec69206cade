package governor

import (
	"context"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// TestCopiedGrantCannotDoubleSpend: a copy of a Grant is the same handle:
// what one draws, commits or cancels the other sees, so the bytes of one
// reservation are drawn, committed and returned once, whichever copy
// (and however many) the holder uses. The checked wrapper accepts a copy
// as the grant it is, and the ledger stays exact.
func TestCopiedGrantCannotDoubleSpend(t *testing.T) {
	const capacity = 1 << 20
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{hostA: capacity})
	h.register("kv", nil, HolderOptions{})
	ctx := context.Background()
	gr, err := h.g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Role: "kv", Bytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	cp := gr
	if !vouched(h.g.Ledger().IssuedGrant(cp)) || !vouched(h.g.Ledger().IssuedAccount(cp)) {
		t.Fatal("the issuer check refused a copy of an issued grant")
	}

	// The checked wrapper draws through the copy; the original sees it.
	mech := fakes.NewMechanism(fakes.Config{Authority: hostA})
	m := checked.Wrap(mech, h.g.Ledger())
	a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 64 << 10}, cp)
	if err != nil {
		t.Fatal(err)
	}
	if gr.drawnNow() != 64<<10 || cp.drawnNow() != 64<<10 {
		t.Fatalf("drawn: original %d, copy %d", gr.drawnNow(), cp.drawnNow())
	}
	// Drawing the rest through both copies takes it once.
	if err := gr.Draw(192 << 10); err != nil {
		t.Fatal(err)
	}
	mustKind(t, cp.Draw(1), memapi.ErrGrantExhausted)
	// Cancelling either copy is refused while bytes are drawn.
	mustKind(t, cp.Cancel(), memapi.ErrInUse)
	h.wantLedger(hostA, ledger{Reserved: 256 << 10, Free: capacity - 256<<10})

	l, err := cp.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gr.Commit(); err == nil {
		t.Fatal("the original committed again after its copy committed")
	} else {
		mustKind(t, err, memapi.ErrGrantClosed)
	}
	mustKind(t, gr.Cancel(), memapi.ErrGrantClosed)
	h.wantLedger(hostA, ledger{Charged: 256 << 10, Free: capacity - 256<<10})

	// A copy of the lease refunds the same lease: the bytes come back
	// once, and the second refund is over the lease.
	lc := l
	if !vouched(h.g.Ledger().IssuedAccount(lc)) {
		t.Fatal("the issuer check refused a copy of a lease")
	}
	if err := m.Free(ctx, a, lc); err != nil {
		t.Fatal(err)
	}
	if l.charged() != 192<<10 {
		t.Fatalf("charged after the copy's refund: %d", l.charged())
	}
	if err := l.Refund(192 << 10); err != nil {
		t.Fatal(err)
	}
	mustKind(t, lc.Refund(1), errOverReturn)
	if n := lc.release(); n != 0 {
		t.Fatalf("a copy of an emptied lease released %d", n)
	}
	h.wantLedger(hostA, ledger{Free: capacity})
	if n := mech.UsedBytes(); n != 0 {
		t.Fatalf("the mechanism holds %d bytes", n)
	}
}

// TestZeroLeaseIsClosed: a zero Lease was never committed: its figures
// read 0, Release returns 0, and every other method fails typed.
func TestZeroLeaseIsClosed(t *testing.T) {
	var l Lease
	if l.charged() != 0 || l.pending() != 0 || l.quarantined() != 0 || l.Bytes() != 0 || l.release() != 0 || l.Authority() != "" || l.holder() != "" {
		t.Fatal("a zero Lease looks committed")
	}
	mustKind(t, l.Refund(1), memapi.ErrGrantClosed)
	mustKind(t, l.MarkPending(1), memapi.ErrGrantClosed)
	mustKind(t, l.Quarantine(1), memapi.ErrGrantClosed)
	mustKind(t, l.refundQuarantined(1), memapi.ErrGrantClosed)
	mustKind(t, l.QuarantinedAccount().Refund(1), memapi.ErrGrantClosed)
}
