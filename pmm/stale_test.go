package pmm_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/stretchr/testify/require"
)

// A decommit of adjacent commits refunds each one's lease in turn (the
// governor's Split). When the first refund empties its lease and another
// reservation of the same size commits at once, and the second refund
// then fails, the region quarantines what it could not remove, the first
// lease included. That lease's record ended: its Quarantine must be
// refused, leaving the other reservation's lease, and the ledger, exactly
// as they were.
func TestSplitRefundFaultSparesTheNextLease(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, gran, nil))
	require.NoError(t, r.Grow(ctx, 3*gran, nil)) // two adjacent commits: gran, then 2*gran

	var other governor.Lease
	e.l.mu.Lock()
	e.l.refunds, e.l.failRefundIf = 0, func(n int) bool { return n == 2 } // the second part of the split
	e.l.beforeFailedRefund = func() {
		// The first part's lease is empty. Reserve and commit the same
		// size for another holder.
		gr, err := e.l.g.Reserve(ctx, governor.Request{Authority: auth, Holder: "w", Role: "other", Bytes: gran})
		if err != nil {
			t.Error(err)
			return
		}
		if err := gr.Draw(gran); err != nil {
			t.Error(err)
			return
		}
		if other, err = gr.Commit(); err != nil {
			t.Error(err)
		}
	}
	e.l.mu.Unlock()

	require.NoError(t, r.Shrink(ctx, 0, nil))
	e.drain(t) // the release: the first refund, the reservation, the failed refund
	require.NotEqual(t, governor.Lease{}, other, "the reservation in the refund did not run")
	require.Equal(t, memapi.Bytes(gran), other.Bytes(), "the other reservation's lease")
	require.ErrorIs(t, other.QuarantinedAccount().Refund(1), memapi.ErrInvalidSize, "the stale lease's quarantine was booked on the other reservation's")
	// The second lease's bytes stay charged, quarantined; the first one's
	// were refunded, and its segment is gone from the region.
	require.Equal(t, figures{Charged: 3 * gran, Quarantined: 2 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(2*gran), r.Quarantined())
	require.Zero(t, e.m.UsedBytes())

	e.l.mu.Lock()
	e.l.failRefundIf, e.l.beforeFailedRefund = nil, nil
	e.l.mu.Unlock()
	// The retry finds the memory freed: it refunds the quarantined bytes.
	require.NoError(t, r.Retry(ctx))
	require.Equal(t, figures{Charged: gran}, e.l.snapshot())
	require.Zero(t, r.Quarantined())
	require.Equal(t, memapi.Bytes(gran), other.Bytes())
	require.NoError(t, other.Refund(gran))
	require.NoError(t, r.Close())
	e.settled(t)
}

// When every refund of a split fails, both pieces stay quarantined, side
// by side, their memory freed: the retry removes them one by one, each
// refunding its quarantined bytes, and the ledger is exact again.
func TestSplitRefundFaultOnEveryPartIsRetried(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, gran, nil))
	require.NoError(t, r.Grow(ctx, 3*gran, nil))
	e.l.mu.Lock()
	e.l.failRefundIf = func(int) bool { return true }
	e.l.mu.Unlock()
	require.NoError(t, r.Shrink(ctx, 0, nil))
	e.drain(t)
	require.Equal(t, figures{Charged: 3 * gran, Quarantined: 3 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(3*gran), r.Quarantined())
	require.Zero(t, e.m.UsedBytes())
	e.l.mu.Lock()
	e.l.failRefundIf = nil
	e.l.mu.Unlock()
	require.NoError(t, r.Retry(ctx))
	require.Equal(t, figures{}, e.l.snapshot())
	require.Zero(t, r.Quarantined())
	require.NoError(t, r.Close())
	e.settled(t)
}
