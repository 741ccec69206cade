package pool_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// What a pending block (freed, its fences not complete) is never taken
// for: a request of another size class on its own stream, and a request
// with no stream when its fences were recorded with none. As in
// TestStreamOrderedReuse, enough requests are made for the shards to run
// dry, so the pending list is where the next block would come from.

// TestPendingBlockIsTakenForItsOwnClassOnly: on its own stream a pending
// block is reusable at once, but only by a request of its size class.
func TestPendingBlockIsTakenForItsOwnClassOnly(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	s := e.stream(t)
	b, err := e.p.Alloc(ctx, 256, s)
	require.NoError(t, err)
	f, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, b.RecordUse(f))
	require.NoError(t, b.Free())
	require.Equal(t, ep.Pending, b.State())

	var got []pool.Block
	for range 4000 {
		o, err := e.p.Alloc(ctx, 4096, s)
		require.NoError(t, err)
		got = append(got, o)
		require.NotEqual(t, b.Addr(), o.Addr(), "a pending block of 256 bytes handed out for 4096")
		require.GreaterOrEqual(t, o.Size(), uint64(4096))
	}
	require.Zero(t, e.p.Stats().StreamReuse)
	for _, o := range got {
		require.NoError(t, o.Free())
	}
	e.fctx.CompleteAll()
	e.checkLedger(t)
}

// TestPendingBlockWithoutAStreamWaitsForItsFence: a block allocated with
// no stream and used by device work (RecordUse) is not reused by another
// request with no stream before that work completes: with no stream there
// is no order to rely on.
func TestPendingBlockWithoutAStreamWaitsForItsFence(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	s := e.stream(t)
	b, err := e.p.Alloc(ctx, 4096, nil)
	require.NoError(t, err)
	f, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, b.RecordUse(f))
	require.NoError(t, b.Free())
	require.Equal(t, ep.Pending, b.State())

	var got []pool.Block
	for range 4000 {
		o, err := e.p.Alloc(ctx, 4096, nil)
		require.NoError(t, err)
		got = append(got, o)
		require.NotEqual(t, b.Addr(), o.Addr(), "reused with no stream before its fence completed")
	}
	require.Zero(t, e.p.Stats().StreamReuse)
	for _, o := range got {
		require.NoError(t, o.Free())
	}
	e.fctx.CompleteAll()
	e.checkLedger(t)
}
