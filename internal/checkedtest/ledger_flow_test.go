package checkedtest

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// TestLedgerFollowsEveryMethod walks every mutating method through the
// wrapper and checks what it drew and refunded, with rounding.
func TestLedgerFollowsEveryMethod(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		drawn := func() memapi.Bytes { d, _, _ := r.g.state(); return d }
		refunded := func() memapi.Bytes { n, _ := r.acct.state(); return n }

		// Allocate rounds to the allocation granularity; Free refunds a.Size.
		a := r.alloc(1000)
		require.EqualValues(t, testAllocGran, a.Size())
		require.EqualValues(t, testAllocGran, drawn())
		require.NoError(t, r.m.Free(ctx, a, r.acct))
		require.EqualValues(t, testAllocGran, refunded())

		// Commit draws r.Len; Decommit refunds it; ReleaseReservation refunds
		// what is still committed.
		res := r.reserve(3*testGran + 1)
		require.EqualValues(t, 4*testGran, res.Size())
		r.commit(res, 0, 2*testGran)
		require.EqualValues(t, testAllocGran+2*testGran, drawn())
		require.NoError(t, r.vb.Decommit(ctx, res, rng(testGran, testGran), r.acct))
		require.EqualValues(t, testAllocGran+testGran, refunded())
		r.commit(res, 2*testGran, 2*testGran)
		require.NoError(t, r.vb.ReleaseReservation(ctx, res, r.acct))
		require.EqualValues(t, testAllocGran+4*testGran, refunded())

		// CreateBacking rounds to the granularity; views cost nothing;
		// CopyOnWrite charges the view's length and releases the old view.
		res = r.reserve(2 * testGran)
		b := r.backing(1000)
		require.EqualValues(t, testGran, b.Size())
		before := drawn()
		v := r.view(res, 0, b, memapi.AccessReadOnly)
		require.Equal(t, before, drawn())
		nv, err := r.sm.CopyOnWrite(ctx, v, r.g)
		require.NoError(t, err)
		require.False(t, v.Live())
		require.True(t, nv.Live())
		require.Equal(t, memapi.AccessReadWrite, nv.Access())
		require.Equal(t, before+testGran, drawn())
		n, err := r.sm.ViewCount(b)
		require.NoError(t, err)
		require.Zero(t, n)
		require.NoError(t, r.sm.UnmapView(ctx, nv))
		require.NoError(t, r.sm.ReleaseBacking(ctx, nv.Backing(), r.acct))
		require.NoError(t, r.sm.ReleaseBacking(ctx, b, r.acct))
		require.NoError(t, r.vb.ReleaseReservation(ctx, res, r.acct))

		require.Equal(t, drawn(), refunded(), "everything drawn was refunded")
		require.Zero(t, r.inner.UsedBytes())
	})
}

// TestMechanismFailureUndraws: when the mechanism fails, the draw goes back
// and the mechanism's error comes out unchanged.
func TestMechanismFailureUndraws(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		res := r.reserve(4 * testGran)
		oom := &memapi.Error{Op: "VirtualBacking.Commit", Kind: memapi.ErrOutOfMemory}
		r.inner.failNext(mCommit, oom)
		d0, draws0, undraws0 := r.g.state()
		err := r.vb.Commit(ctx, res, rng(0, testGran), r.g)
		require.Same(t, oom, err)
		d1, draws1, undraws1 := r.g.state()
		require.Equal(t, d0, d1)
		require.Equal(t, draws0+1, draws1)
		require.Equal(t, undraws0+1, undraws1)

		// Same for a creating call.
		r.inner.failNext(mAllocate, oom)
		a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, r.g)
		require.Nil(t, a)
		require.Same(t, oom, err)
		d2, _, _ := r.g.state()
		require.Equal(t, d0, d2)
	})
}

// TestUndrawFailureIsJoined: a grant that refuses the undraw does not hide the
// mechanism's error; both come out.
func TestUndrawFailureIsJoined(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		res := r.reserve(4 * testGran)
		r.g.failUndraw = memapi.Errorf("Grant.Undraw", memapi.ErrGrantClosed, "closed under our feet")
		r.inner.failNext(mCommit, memapi.Errorf("VirtualBacking.Commit", memapi.ErrOutOfMemory, "no"))
		err := r.vb.Commit(ctx, res, rng(0, testGran), r.g)
		require.ErrorIs(t, err, memapi.ErrOutOfMemory)
		require.ErrorIs(t, err, memapi.ErrGrantClosed)
	})
}

// TestFailedReleaseRefundsNothing: a release the mechanism refuses (views
// still mapped) refunds nothing and leaves the handle live.
func TestFailedReleaseRefundsNothing(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		res := r.reserve(testGran)
		b := r.backing(testGran)
		r.view(res, 0, b, memapi.AccessReadOnly)
		err := r.sm.ReleaseBacking(ctx, b, r.acct)
		requireKind(t, err, memapi.ErrInUse, "")
		require.True(t, b.Live())
		err = r.vb.ReleaseReservation(ctx, res, r.acct)
		requireKind(t, err, memapi.ErrInUse, "")
		require.True(t, res.Live())
		n, refunds := r.acct.state()
		require.Zero(t, n)
		require.Zero(t, refunds)
	})
}

// TestRefundFailureIsReported: the memory is released (the handle is gone)
// but the account's error is returned, so the caller knows the ledger is off.
func TestRefundFailureIsReported(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		a := r.alloc(1)
		refuse := errors.New("account closed")
		r.acct.fail = refuse
		err := r.m.Free(ctx, a, r.acct)
		require.ErrorIs(t, err, refuse)
		require.False(t, a.Live())
		require.Zero(t, r.inner.UsedBytes())
	})
}

// TestReleaseReservationRefundsNothingWhenNothingCommitted: a refund of 0 is
// not sent at all.
func TestReleaseReservationRefundsNothingWhenNothingCommitted(t *testing.T) {
	r := newRig(t, false)
	res := r.reserve(testGran)
	require.NoError(t, r.vb.ReleaseReservation(ctx, res, r.acct))
	_, refunds := r.acct.state()
	require.Zero(t, refunds)
}
