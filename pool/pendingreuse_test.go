package pool_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
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
	pendingNeverTaken(t, 256, 4096, true, "a pending block of 256 bytes handed out for 4096")
}

// TestPendingBlockWithoutAStreamWaitsForItsFence: a block allocated with
// no stream and used by device work (RecordUse) is not reused by another
// request with no stream before that work completes: with no stream there
// is no order to rely on.
func TestPendingBlockWithoutAStreamWaitsForItsFence(t *testing.T) {
	pendingNeverTaken(t, 4096, 4096, false, "reused with no stream before its fence completed")
}

// pendingNeverTaken frees a block of size bytes (on a stream, or on none
// when onStream is false) behind a fence that does not complete, then
// asks for want bytes on the same stream (or none) until the shards are
// dry, failing with why if the pending block is handed out.
func pendingNeverTaken(t *testing.T, size, want memapi.Bytes, onStream bool, why string) {
	e := setup(t, 1<<30, pool.Options{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	s := e.stream(t)
	var on memapi.Stream
	if onStream {
		on = s
	}
	b, err := e.p.Alloc(ctx, size, on)
	require.NoError(t, err)
	f, err := s.Record()
	require.NoError(t, err)
	require.NoError(t, b.RecordUse(f))
	require.NoError(t, b.Free())
	require.Equal(t, ep.Pending, b.State())

	var got []pool.Block
	for range 4000 {
		o, err := e.p.Alloc(ctx, want, on)
		require.NoError(t, err)
		got = append(got, o)
		require.NotEqual(t, b.Addr(), o.Addr(), why)
		require.GreaterOrEqual(t, o.Size(), want)
	}
	require.Zero(t, e.p.Stats().StreamReuse)
	for _, o := range got {
		require.NoError(t, o.Free())
	}
	e.fctx.CompleteAll()
	e.checkLedger(t)
}
