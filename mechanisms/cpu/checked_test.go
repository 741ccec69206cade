package cpu

import (
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// TestCheckedLedger runs the CPU mechanism through the checked wrapper in
// verify mode: every figure the mechanism reports moves by exactly what the
// spec declares (or the wrapper fails the call as untruthful), and the
// grant's drawn bytes follow the mechanism's UsedBytes and the kernel's
// figures at every step.
func TestCheckedLedger(t *testing.T) {
	granularities(t, func(t *testing.T, gran memapi.Bytes) {
		cpu := newMech(t, gran)
		m := checked.Wrap(cpu, fakes.Ledger, checked.WithVerify())
		if m.Info() != cpu.Info() || memapi.Negotiate(m) != memapi.Negotiate(cpu) {
			t.Fatal("the wrapper does not present the mechanism")
		}
		vb, err := memapi.RequireVirtualBacking(m)
		if err != nil {
			t.Fatal(err)
		}
		sm, err := memapi.RequireSharedMapping(m)
		if err != nil {
			t.Fatal(err)
		}
		gr := fakes.NewGrant(cpu.Info().Authority, 1<<30)
		step := func(what string, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if gr.Drawn() != cpu.UsedBytes() {
				t.Fatalf("after %s: grant drawn %d, mechanism uses %d", what, gr.Drawn(), cpu.UsedBytes())
			}
			checkKernel(t, cpu)
		}
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 5000}, gr)
		step("Allocate", err)
		res, err := vb.Reserve(bg, memapi.ReserveRequest{Size: 8 * gran})
		step("Reserve", err)
		step("Commit", vb.Commit(bg, res, memapi.Range{Off: 0, Len: 3 * gran}, gr))
		step("Decommit", vb.Decommit(bg, res, memapi.Range{Off: gran, Len: gran}, gr))
		b, err := sm.CreateBacking(bg, 2*gran, gr)
		step("CreateBacking", err)
		v, err := sm.MapView(bg, res, memapi.Range{Off: 4 * gran, Len: 2 * gran}, b, memapi.AccessReadOnly)
		step("MapView", err)
		cow, err := sm.CopyOnWrite(bg, v, gr)
		step("CopyOnWrite", err)

		// Refused calls leave the mechanism and the ledger as they were.
		drawn := gr.Drawn()
		for _, tc := range []struct {
			err  error
			kind error
		}{
			{vb.Commit(bg, res, memapi.Range{Off: 0, Len: gran}, gr), memapi.ErrCommitted},
			{vb.Commit(bg, res, memapi.Range{Off: 8 * gran, Len: gran}, gr), memapi.ErrInvalidRange},
			{vb.Commit(bg, res, memapi.Range{Off: 2 * gran, Len: gran}, nil), memapi.ErrNoGrant},
			{vb.Commit(bg, res, memapi.Range{Off: 2 * gran, Len: gran}, fakes.NewGrant("elsewhere", 1<<30)), memapi.ErrAuthorityMismatch},
			{vb.Decommit(bg, res, memapi.Range{Off: gran, Len: gran}, gr), memapi.ErrNotCommitted},
			{vb.ReleaseReservation(bg, res, gr), memapi.ErrInUse},
			{m.Free(bg, a, nil), memapi.ErrNoAccount},
		} {
			wantKind(t, tc.err, tc.kind)
			if gr.Drawn() != drawn || gr.Drawn() != cpu.UsedBytes() {
				t.Fatalf("refused call (%v) moved the ledger: drawn %d, want %d, used %d", tc.err, gr.Drawn(), drawn, cpu.UsedBytes())
			}
		}
		// b's only view was replaced by the copy, so b can go.
		if n, _ := sm.ViewCount(b); n != 0 {
			t.Fatalf("ViewCount(b) = %d after CopyOnWrite of its only view", n)
		}
		step("ReleaseBacking", sm.ReleaseBacking(bg, b, gr))
		step("UnmapView", sm.UnmapView(bg, cow))
		step("ReleaseBacking(copy)", sm.ReleaseBacking(bg, cow.Backing(), gr))
		step("ReleaseReservation", vb.ReleaseReservation(bg, res, gr))
		step("Free", m.Free(bg, a, gr))
		if gr.Drawn() != 0 {
			t.Fatalf("grant still has %d drawn", gr.Drawn())
		}
	})
}
