package checkedtest

import (
	"math"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// rejection is a call the wrapper must refuse with a typed error before
// calling the mechanism or touching the ledger.
type rejection struct {
	name string
	op   string
	want error
	// prep builds what the call needs (through the wrapper or elsewhere) and
	// returns the call; the snapshot is taken between the two.
	prep func(r *rig) (call func() error)
	// ledgerCalled: the ledger is asked (and refuses) — its figures must
	// still be unchanged, but the call counts move.
	ledgerCalled bool
	// after checks what must still hold, such as a handle still being live.
	after func(t *testing.T, r *rig)
}

const (
	opAllocate      = "DeviceAllocator.Allocate"
	opFree          = "DeviceAllocator.Free"
	opReserve       = "VirtualBacking.Reserve"
	opCommit        = "VirtualBacking.Commit"
	opDecommit      = "VirtualBacking.Decommit"
	opCommitted     = "VirtualBacking.CommittedBytes"
	opReleaseRes    = "VirtualBacking.ReleaseReservation"
	opCreateBacking = "SharedMapping.CreateBacking"
	opMapView       = "SharedMapping.MapView"
	opUnmapView     = "SharedMapping.UnmapView"
	opCopyOnWrite   = "SharedMapping.CopyOnWrite"
	opViewCount     = "SharedMapping.ViewCount"
	opReleaseBack   = "SharedMapping.ReleaseBacking"
)

// other returns a second instance of the same authority, whose handles are
// foreign to the rig's mechanism.
func other(t *testing.T) *mech {
	t.Helper()
	return newMech(auth, 0)
}

func foreignAlloc(t *testing.T) *memapi.Allocation {
	a, err := other(t).Allocate(ctx, memapi.AllocRequest{Size: 1}, newGrant(auth, 0))
	require.NoError(t, err)
	return a
}

func foreignRes(t *testing.T) *memapi.Reservation {
	res, err := other(t).Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NoError(t, err)
	return res
}

func foreignBacking(t *testing.T) *memapi.Backing {
	b, err := other(t).CreateBacking(ctx, testGran, newGrant(auth, 0))
	require.NoError(t, err)
	return b
}

func foreignView(t *testing.T) *memapi.View {
	o := other(t)
	res, err := o.Reserve(ctx, memapi.ReserveRequest{Size: testGran})
	require.NoError(t, err)
	b, err := o.CreateBacking(ctx, testGran, newGrant(auth, 0))
	require.NoError(t, err)
	v, err := o.MapView(ctx, res, memapi.Range{Len: testGran}, b, memapi.AccessReadOnly)
	require.NoError(t, err)
	return v
}

func rng(off, n memapi.Bytes) memapi.Range { return memapi.Range{Off: off, Len: n} }

func rejections() []rejection {
	foreignGrant := func(r *rig) *grant { return newGrant("elsewhere", 0) }
	foreignAccount := func(r *rig) *account { return newAccount("elsewhere") }
	var handle memapi.Handle // set by prep, read by after
	keep := func(h memapi.Handle) memapi.Handle { handle = h; return h }
	stillLive := func(t *testing.T, r *rig) { require.True(t, handle.Live(), "%v must still be live", handle) }
	return []rejection{
		// DeviceAllocator.Allocate
		{name: "Allocate/nil grant", op: opAllocate, want: memapi.ErrNoGrant, prep: func(r *rig) func() error {
			return func() error { _, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, nil); return err }
		}},
		{name: "Allocate/grant of another authority", op: opAllocate, want: memapi.ErrAuthorityMismatch, prep: func(r *rig) func() error {
			g := foreignGrant(r)
			return func() error { _, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, g); return err }
		}},
		{name: "Allocate/zero size", op: opAllocate, want: memapi.ErrInvalidSize, prep: func(r *rig) func() error {
			return func() error { _, err := r.m.Allocate(ctx, memapi.AllocRequest{}, r.g); return err }
		}},
		{name: "Allocate/size overflows rounding", op: opAllocate, want: memapi.ErrInvalidSize, prep: func(r *rig) func() error {
			return func() error { _, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: math.MaxUint64}, r.g); return err }
		}},
		{name: "Allocate/grant exhausted", op: "Grant.Draw", want: memapi.ErrGrantExhausted, ledgerCalled: true, prep: func(r *rig) func() error {
			r.g.limit = testAllocGran
			return func() error {
				_, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: testAllocGran + 1}, r.g)
				return err
			}
		}},
		// DeviceAllocator.Free
		{name: "Free/nil handle", op: opFree, want: memapi.ErrNilHandle, prep: func(r *rig) func() error {
			return func() error { return r.m.Free(ctx, nil, r.acct) }
		}},
		{name: "Free/foreign handle", op: opFree, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			a := keep(foreignAlloc(r.t)).(*memapi.Allocation)
			return func() error { return r.m.Free(ctx, a, r.acct) }
		}, after: stillLive},
		{name: "Free/double free", op: opFree, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			a := r.alloc(1)
			require.NoError(r.t, r.m.Free(ctx, a, r.acct))
			return func() error { return r.m.Free(ctx, a, r.acct) }
		}},
		{name: "Free/nil account", op: opFree, want: memapi.ErrNoAccount, prep: func(r *rig) func() error {
			a := keep(r.alloc(1)).(*memapi.Allocation)
			return func() error { return r.m.Free(ctx, a, nil) }
		}, after: stillLive},
		{name: "Free/account of another authority", op: opFree, want: memapi.ErrAuthorityMismatch, prep: func(r *rig) func() error {
			a := keep(r.alloc(1)).(*memapi.Allocation)
			acct := foreignAccount(r)
			return func() error { return r.m.Free(ctx, a, acct) }
		}, after: stillLive},
		// VirtualBacking.Reserve
		{name: "Reserve/zero size", op: opReserve, want: memapi.ErrInvalidSize, prep: func(r *rig) func() error {
			return func() error { _, err := r.vb.Reserve(ctx, memapi.ReserveRequest{}); return err }
		}},
		// VirtualBacking.Commit
		{name: "Commit/nil reservation", op: opCommit, want: memapi.ErrNilHandle, prep: func(r *rig) func() error {
			return func() error { return r.vb.Commit(ctx, nil, rng(0, testGran), r.g) }
		}},
		{name: "Commit/foreign reservation", op: opCommit, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			res := foreignRes(r.t)
			return func() error { return r.vb.Commit(ctx, res, rng(0, testGran), r.g) }
		}},
		{name: "Commit/released reservation", op: opCommit, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			require.NoError(r.t, r.vb.ReleaseReservation(ctx, res, r.acct))
			return func() error { return r.vb.Commit(ctx, res, rng(0, testGran), r.g) }
		}},
		{name: "Commit/range beyond reservation", op: opCommit, want: memapi.ErrInvalidRange, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error { return r.vb.Commit(ctx, res, rng(3*testGran, 2*testGran), r.g) }
		}},
		{name: "Commit/empty range", op: opCommit, want: memapi.ErrInvalidRange, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error { return r.vb.Commit(ctx, res, rng(testGran, 0), r.g) }
		}},
		{name: "Commit/range end overflows", op: opCommit, want: memapi.ErrInvalidRange, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error { return r.vb.Commit(ctx, res, rng(math.MaxUint64-testGran+1, 2*testGran), r.g) }
		}},
		{name: "Commit/unaligned offset", op: opCommit, want: memapi.ErrUnaligned, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error { return r.vb.Commit(ctx, res, rng(4096, testGran), r.g) }
		}},
		{name: "Commit/unaligned length", op: opCommit, want: memapi.ErrUnaligned, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error { return r.vb.Commit(ctx, res, rng(0, 4096), r.g) }
		}},
		{name: "Commit/nil grant", op: opCommit, want: memapi.ErrNoGrant, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error { return r.vb.Commit(ctx, res, rng(0, testGran), nil) }
		}},
		{name: "Commit/grant of another authority", op: opCommit, want: memapi.ErrAuthorityMismatch, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			g := foreignGrant(r)
			return func() error { return r.vb.Commit(ctx, res, rng(0, testGran), g) }
		}},
		// VirtualBacking.Decommit
		{name: "Decommit/nil account", op: opDecommit, want: memapi.ErrNoAccount, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			r.commit(res, 0, testGran)
			return func() error { return r.vb.Decommit(ctx, res, rng(0, testGran), nil) }
		}},
		{name: "Decommit/account of another authority", op: opDecommit, want: memapi.ErrAuthorityMismatch, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			r.commit(res, 0, testGran)
			acct := foreignAccount(r)
			return func() error { return r.vb.Decommit(ctx, res, rng(0, testGran), acct) }
		}},
		{name: "Decommit/unaligned", op: opDecommit, want: memapi.ErrUnaligned, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			r.commit(res, 0, testGran)
			return func() error { return r.vb.Decommit(ctx, res, rng(0, testGran/2), r.acct) }
		}},
		{name: "Decommit/range beyond reservation", op: opDecommit, want: memapi.ErrInvalidRange, prep: func(r *rig) func() error {
			res := r.reserve(testGran)
			r.commit(res, 0, testGran)
			return func() error { return r.vb.Decommit(ctx, res, rng(0, 2*testGran), r.acct) }
		}},
		{name: "Decommit/foreign reservation", op: opDecommit, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			res := foreignRes(r.t)
			return func() error { return r.vb.Decommit(ctx, res, rng(0, testGran), r.acct) }
		}},
		// VirtualBacking.CommittedBytes
		{name: "CommittedBytes/released reservation", op: opCommitted, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			res := r.reserve(testGran)
			require.NoError(r.t, r.vb.ReleaseReservation(ctx, res, r.acct))
			return func() error { _, err := r.vb.CommittedBytes(res); return err }
		}},
		{name: "CommittedBytes/foreign reservation", op: opCommitted, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			res := foreignRes(r.t)
			return func() error { _, err := r.vb.CommittedBytes(res); return err }
		}},
		// VirtualBacking.ReleaseReservation
		{name: "ReleaseReservation/double release", op: opReleaseRes, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			res := r.reserve(testGran)
			require.NoError(r.t, r.vb.ReleaseReservation(ctx, res, r.acct))
			return func() error { return r.vb.ReleaseReservation(ctx, res, r.acct) }
		}},
		{name: "ReleaseReservation/foreign reservation", op: opReleaseRes, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			res := keep(foreignRes(r.t)).(*memapi.Reservation)
			return func() error { return r.vb.ReleaseReservation(ctx, res, r.acct) }
		}, after: stillLive},
		{name: "ReleaseReservation/nil account", op: opReleaseRes, want: memapi.ErrNoAccount, prep: func(r *rig) func() error {
			res := keep(r.reserve(testGran)).(*memapi.Reservation)
			r.commit(res, 0, testGran)
			return func() error { return r.vb.ReleaseReservation(ctx, res, nil) }
		}, after: stillLive},
		{name: "ReleaseReservation/nil handle", op: opReleaseRes, want: memapi.ErrNilHandle, prep: func(r *rig) func() error {
			return func() error { return r.vb.ReleaseReservation(ctx, nil, r.acct) }
		}},
		// SharedMapping.CreateBacking
		{name: "CreateBacking/zero size", op: opCreateBacking, want: memapi.ErrInvalidSize, prep: func(r *rig) func() error {
			return func() error { _, err := r.sm.CreateBacking(ctx, 0, r.g); return err }
		}},
		{name: "CreateBacking/size overflows rounding", op: opCreateBacking, want: memapi.ErrInvalidSize, prep: func(r *rig) func() error {
			return func() error { _, err := r.sm.CreateBacking(ctx, math.MaxUint64-1, r.g); return err }
		}},
		{name: "CreateBacking/nil grant", op: opCreateBacking, want: memapi.ErrNoGrant, prep: func(r *rig) func() error {
			return func() error { _, err := r.sm.CreateBacking(ctx, 1, nil); return err }
		}},
		{name: "CreateBacking/grant of another authority", op: opCreateBacking, want: memapi.ErrAuthorityMismatch, prep: func(r *rig) func() error {
			g := foreignGrant(r)
			return func() error { _, err := r.sm.CreateBacking(ctx, 1, g); return err }
		}},
		// SharedMapping.MapView
		{name: "MapView/nil backing", op: opMapView, want: memapi.ErrNilHandle, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			return func() error {
				_, err := r.sm.MapView(ctx, res, rng(0, testGran), nil, memapi.AccessReadOnly)
				return err
			}
		}},
		{name: "MapView/foreign backing", op: opMapView, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			b := foreignBacking(r.t)
			return func() error { _, err := r.sm.MapView(ctx, res, rng(0, testGran), b, memapi.AccessReadOnly); return err }
		}},
		{name: "MapView/released backing", op: opMapView, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			b := r.backing(testGran)
			require.NoError(r.t, r.sm.ReleaseBacking(ctx, b, r.acct))
			return func() error { _, err := r.sm.MapView(ctx, res, rng(0, testGran), b, memapi.AccessReadOnly); return err }
		}},
		{name: "MapView/released reservation", op: opMapView, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			b := r.backing(testGran)
			require.NoError(r.t, r.vb.ReleaseReservation(ctx, res, r.acct))
			return func() error { _, err := r.sm.MapView(ctx, res, rng(0, testGran), b, memapi.AccessReadOnly); return err }
		}},
		{name: "MapView/range beyond reservation", op: opMapView, want: memapi.ErrInvalidRange, prep: func(r *rig) func() error {
			res := r.reserve(testGran)
			b := r.backing(testGran)
			return func() error {
				_, err := r.sm.MapView(ctx, res, rng(testGran, testGran), b, memapi.AccessReadOnly)
				return err
			}
		}},
		{name: "MapView/unaligned range", op: opMapView, want: memapi.ErrUnaligned, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			b := r.backing(testGran)
			return func() error {
				_, err := r.sm.MapView(ctx, res, rng(4096, testGran), b, memapi.AccessReadOnly)
				return err
			}
		}},
		{name: "MapView/range not the backing's size", op: opMapView, want: memapi.ErrInvalidRange, prep: func(r *rig) func() error {
			res := r.reserve(4 * testGran)
			b := r.backing(testGran)
			return func() error {
				_, err := r.sm.MapView(ctx, res, rng(0, 2*testGran), b, memapi.AccessReadOnly)
				return err
			}
		}},
		// SharedMapping.UnmapView
		{name: "UnmapView/nil view", op: opUnmapView, want: memapi.ErrNilHandle, prep: func(r *rig) func() error {
			return func() error { return r.sm.UnmapView(ctx, nil) }
		}},
		{name: "UnmapView/foreign view", op: opUnmapView, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			v := keep(foreignView(r.t)).(*memapi.View)
			return func() error { return r.sm.UnmapView(ctx, v) }
		}, after: stillLive},
		{name: "UnmapView/double unmap", op: opUnmapView, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			v := r.view(r.reserve(testGran), 0, r.backing(testGran), memapi.AccessReadOnly)
			require.NoError(r.t, r.sm.UnmapView(ctx, v))
			return func() error { return r.sm.UnmapView(ctx, v) }
		}},
		// SharedMapping.CopyOnWrite
		{name: "CopyOnWrite/view replaced already", op: opCopyOnWrite, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			v := r.view(r.reserve(testGran), 0, r.backing(testGran), memapi.AccessReadOnly)
			_, err := r.sm.CopyOnWrite(ctx, v, r.g)
			require.NoError(r.t, err)
			return func() error { _, err := r.sm.CopyOnWrite(ctx, v, r.g); return err }
		}},
		{name: "CopyOnWrite/nil grant", op: opCopyOnWrite, want: memapi.ErrNoGrant, prep: func(r *rig) func() error {
			v := keep(r.view(r.reserve(testGran), 0, r.backing(testGran), memapi.AccessReadOnly)).(*memapi.View)
			return func() error { _, err := r.sm.CopyOnWrite(ctx, v, nil); return err }
		}, after: stillLive},
		{name: "CopyOnWrite/grant of another authority", op: opCopyOnWrite, want: memapi.ErrAuthorityMismatch, prep: func(r *rig) func() error {
			v := keep(r.view(r.reserve(testGran), 0, r.backing(testGran), memapi.AccessReadOnly)).(*memapi.View)
			g := foreignGrant(r)
			return func() error { _, err := r.sm.CopyOnWrite(ctx, v, g); return err }
		}, after: stillLive},
		{name: "CopyOnWrite/foreign view", op: opCopyOnWrite, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			v := foreignView(r.t)
			return func() error { _, err := r.sm.CopyOnWrite(ctx, v, r.g); return err }
		}},
		// SharedMapping.ViewCount
		{name: "ViewCount/released backing", op: opViewCount, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			b := r.backing(testGran)
			require.NoError(r.t, r.sm.ReleaseBacking(ctx, b, r.acct))
			return func() error { _, err := r.sm.ViewCount(b); return err }
		}},
		// SharedMapping.ReleaseBacking
		{name: "ReleaseBacking/double release", op: opReleaseBack, want: memapi.ErrReleased, prep: func(r *rig) func() error {
			b := r.backing(testGran)
			require.NoError(r.t, r.sm.ReleaseBacking(ctx, b, r.acct))
			return func() error { return r.sm.ReleaseBacking(ctx, b, r.acct) }
		}},
		{name: "ReleaseBacking/nil account", op: opReleaseBack, want: memapi.ErrNoAccount, prep: func(r *rig) func() error {
			b := keep(r.backing(testGran)).(*memapi.Backing)
			return func() error { return r.sm.ReleaseBacking(ctx, b, nil) }
		}, after: stillLive},
		{name: "ReleaseBacking/foreign backing", op: opReleaseBack, want: memapi.ErrForeignHandle, prep: func(r *rig) func() error {
			b := keep(foreignBacking(r.t)).(*memapi.Backing)
			return func() error { return r.sm.ReleaseBacking(ctx, b, r.acct) }
		}, after: stillLive},
	}
}

// TestRejections shows every typed error of the wrapper, and that a rejected
// call neither reached the mechanism nor moved the ledger.
func TestRejections(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		for _, c := range rejections() {
			t.Run(c.name, func(t *testing.T) {
				r := newRig(t, verify)
				call := c.prep(r)
				before := r.snap()
				err := call()
				requireKind(t, err, c.want, c.op)
				after := r.snap()
				if c.ledgerCalled {
					require.Equal(t, before.drawn, after.drawn, "grant figures")
					require.Equal(t, before.refunded, after.refunded, "account figures")
					before.draws, before.undraws, before.refunds = after.draws, after.undraws, after.refunds
				}
				require.Equal(t, before, after, "a rejected call must change nothing (mechanism calls, used bytes, ledger)")
				if c.after != nil {
					c.after(t, r)
				}
			})
		}
	})
}

// TestRejectionsReachTheBareMechanism is the control: the same foreign and
// released handles given to the bare mechanism do reach it (and it rejects
// them itself), so the wrapper's "not called" above is its own doing.
func TestRejectionsReachTheBareMechanism(t *testing.T) {
	m := newMech(auth, 0)
	a := foreignAlloc(t)
	err := m.Free(ctx, a, newAccount(auth))
	requireKind(t, err, memapi.ErrForeignHandle, "")
	require.EqualValues(t, 1, m.count(mFree))
}

func TestErrorsCarryFigures(t *testing.T) {
	r := newRig(t, false)
	res := r.reserve(testGran)
	err := r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g)
	me := requireKind(t, err, memapi.ErrInvalidRange, opCommit)
	require.Equal(t, res.ID(), me.Handle)
	require.EqualValues(t, 2*testGran, me.Wanted)
	require.EqualValues(t, testGran, me.Available)
	require.Equal(t, auth, me.Authority)
	require.Contains(t, me.Error(), "within(r, res)")

	err = r.vb.Commit(ctx, res, rng(0, testGran), newGrant("elsewhere", 0))
	me = requireKind(t, err, memapi.ErrAuthorityMismatch, opCommit)
	require.Contains(t, me.Detail, `"elsewhere"`)
}
