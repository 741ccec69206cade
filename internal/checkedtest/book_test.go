package checkedtest

import (
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// TestReleaseReservationRefundsBookedBytes: ReleaseReservation refunds what
// was committed in the reservation through the wrapper (commits less
// decommits), read from the wrapper's own book rather than by querying the
// mechanism first (outside verify mode it asks CommittedBytes nothing). A
// rewrap shares the book, so a release through it refunds the same bytes.
func TestReleaseReservationRefundsBookedBytes(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		res := r.reserve(4 * testGran)
		r.commit(res, 0, 2*testGran)
		r.commit(res, 3*testGran, testGran)
		require.NoError(t, r.vb.Decommit(ctx, res, rng(0, testGran), r.acct))
		queries := r.inner.count(mCommittedBytes)
		require.NoError(t, r.vb.ReleaseReservation(ctx, res, r.acct))
		refunded, _ := r.acct.state()
		require.EqualValues(t, 3*testGran, refunded, "one granule by Decommit, two by the release")
		drawn, _, _ := r.g.state()
		require.EqualValues(t, 3*testGran, drawn)
		require.Zero(t, r.inner.UsedBytes())
		if !verify {
			require.Equal(t, queries, r.inner.count(mCommittedBytes), "the release asks the mechanism nothing")
		}

		// Committed through the wrapper, released through a rewrap of it.
		res = r.reserve(4 * testGran)
		r.commit(res, testGran, 2*testGran)
		vb, _ := checked.Wrap(r.m, doubles).AsVirtualBacking()
		require.NoError(t, vb.ReleaseReservation(ctx, res, r.acct))
		refunded, _ = r.acct.state()
		require.EqualValues(t, 5*testGran, refunded)
		require.Zero(t, r.inner.UsedBytes())
	})
}

// TestChargeBookCannotBeClaimedOrForged: package checked holds the only
// memapi.ChargeBook (claimed at its initialization); a ChargeBook value made
// by anyone else changes no handle's figure, so it cannot make a refund larger
// or smaller.
func TestChargeBookCannotBeClaimedOrForged(t *testing.T) {
	require.Nil(t, memapi.ClaimChargeBook(), "package checked claimed the book when it was initialized")
	r := newRig(t, false)
	res := r.reserve(4 * testGran)
	r.commit(res, 0, testGran)
	forged := &memapi.ChargeBook{}
	forged.Add(res, 1<<30)
	require.Zero(t, forged.Charged(res), "a forged book reads nothing")
	forged.Clear(res)
	require.NoError(t, r.vb.ReleaseReservation(ctx, res, r.acct))
	refunded, _ := r.acct.state()
	require.EqualValues(t, testGran, refunded)
}
