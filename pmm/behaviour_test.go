package pmm_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// These pin behaviours the rest of the suite walked past: each fails when
// the line that makes it so is removed.

// notDrained checks that the queue still holds a release after a short wait.
func (e *env) notDrained(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, e.ectx.Queue().Drain(ctx), memapi.ErrInUse, "a release ran before its fence completed")
}

// Region.Close marks every segment's lease pending until the fences
// complete.
func TestRegionCloseMarksItsSegmentsPending(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, gran, nil))
	require.NoError(t, r.Grow(ctx, 3*gran, nil))
	f := e.fence(t)
	require.NoError(t, r.RecordUse(f))
	require.NoError(t, r.Close())
	require.Equal(t, figures{Pending: 3 * gran}, e.l.snapshot())
	e.notDrained(t)
	require.Equal(t, memapi.Bytes(3*gran), e.m.UsedBytes())
	f.Complete()
	e.settled(t)
}

// Shrink's release waits for the region's fences, however long they take.
func TestShrinkReleaseWaitsForTheRegionsFences(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 3*gran, nil))
	f := e.fence(t)
	require.NoError(t, r.RecordUse(f))
	require.NoError(t, r.Shrink(ctx, gran, nil))
	e.notDrained(t)
	require.Equal(t, memapi.Bytes(3*gran), e.m.UsedBytes(), "decommitted before the fence completed")
	require.Equal(t, figures{Charged: gran, Pending: 2 * gran}, e.l.snapshot())
	f.Complete()
	e.drain(t)
	require.Equal(t, memapi.Bytes(gran), e.m.UsedBytes())
	require.NoError(t, r.Close())
	e.settled(t)
}

// A transaction waits for an earlier shrink's release: the range is not
// reusable until it is really gone.
func TestTransactionWaitsForAnEarlierShrink(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 3*gran, nil))
	f := e.fence(t)
	require.NoError(t, r.RecordUse(f))
	require.NoError(t, r.Shrink(ctx, gran, nil))
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err := r.Grow(short, 3*gran, nil)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, memapi.Bytes(gran), r.Len())
	f.Complete()
	require.NoError(t, r.Grow(ctx, 3*gran, nil))
	require.NoError(t, r.Close())
	e.settled(t)
}

// Shrink shortens a segment it cuts partway: what stays is released once,
// at its new length.
func TestShrinkShortensTheSegmentItCuts(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	_, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, 4*gran, nil)) // one segment
	require.NoError(t, r.Shrink(ctx, gran, nil))
	e.drain(t)
	require.Equal(t, figures{Charged: gran}, e.l.snapshot())
	require.NoError(t, r.Grow(ctx, 2*gran, nil))
	require.NoError(t, r.Close())
	e.settled(t)
	require.Zero(t, e.ectx.Quarantined(), "the release removed a range twice")
}

// A shared backing's free marks its lease pending while its fences run.
func TestSharedFreeMarksPending(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	b := e.bind(t, "p", "kv")
	sh, err := b.CreateShared(context.Background(), gran)
	require.NoError(t, err)
	f := e.fence(t)
	require.NoError(t, sh.RecordUse(f))
	require.NoError(t, sh.Close())
	require.Equal(t, figures{Pending: gran}, e.l.snapshot())
	e.notDrained(t)
	f.Complete()
	e.settled(t)
}

// Copy-on-write drops the shared reference behind the region's fences: the
// shared backing (closed by its owner) is freed only after the work that
// read the old view completed.
func TestCopyOnWriteDropsTheSharedReferenceBehindFences(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	b := e.bind(t, "p", "kv")
	ctx := context.Background()
	sh, err := b.CreateShared(ctx, gran)
	require.NoError(t, err)
	r, err := b.ReserveVirtual(ctx, 4*gran)
	require.NoError(t, err)
	_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
	require.NoError(t, err)
	require.NoError(t, sh.Close())
	f := e.fence(t)
	require.NoError(t, r.RecordUse(f))
	require.NoError(t, r.CopyOnWrite(ctx, 0))
	require.Zero(t, sh.Views())
	e.notDrained(t)
	require.Equal(t, memapi.Bytes(2*gran), e.m.UsedBytes(), "the shared backing was freed under work still reading it")
	f.Complete()
	e.drain(t)
	require.Equal(t, memapi.Bytes(gran), e.m.UsedBytes())
	require.NoError(t, r.Close())
	e.settled(t)
}
