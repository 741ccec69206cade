package pool_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

func TestClasses(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	ctx := context.Background()
	for _, n := range []memapi.Bytes{1, 255, 256, 257, 1000, 1024, 1025, 1280, 1281, 65536, 65537, 900 << 10, 1 << 20} {
		b, err := e.p.Alloc(ctx, n, nil)
		require.NoError(t, err)
		require.Zero(t, uint64(b.Addr())%pool.Alignment)
		r := b.Rounded()
		require.GreaterOrEqual(t, r, n)
		if n > 1024 && n <= pool.SmallMax {
			require.LessOrEqual(t, float64(r), float64(n)*1.25+1, "four classes per doubling: at most 25%% rounding for %d", n)
		}
		require.NoError(t, b.Free())
	}
}

func TestErrors(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	o := setup(t, 1<<30, pool.Options{})
	ctx := context.Background()
	_, err := e.p.Alloc(ctx, 0, nil)
	require.ErrorIs(t, err, memapi.ErrInvalidSize)
	_, err = e.p.Alloc(ctx, pool.MaxAlloc+1, nil)
	require.ErrorIs(t, err, memapi.ErrInvalidSize)
	for _, n := range []memapi.Bytes{4096, 4 << 20} {
		b, err := e.p.Alloc(ctx, n, nil)
		require.NoError(t, err)
		require.ErrorIs(t, o.p.Free(b), pool.ErrForeignBlock)
		require.ErrorIs(t, o.p.Free(b), memapi.ErrForeignHandle)
		require.Equal(t, ep.Open, b.State())
		before := e.p.Stats()
		require.NoError(t, b.Free())
		require.Equal(t, ep.Released, b.State())
		after := e.p.Stats()
		require.ErrorIs(t, b.Free(), pool.ErrDoubleFree)
		require.Equal(t, after, e.p.Stats(), "a double free changes nothing")
		require.Equal(t, before.Frees+1, after.Frees)
	}
	require.ErrorIs(t, pool.Block{}.Free(), pool.ErrForeignBlock)
	_, err = pool.New(e.p.Binding(), pool.Options{Backing: "bogus"})
	require.ErrorIs(t, err, memapi.ErrUnsupported)

	b, err := e.p.Alloc(ctx, 100, nil)
	require.NoError(t, err)
	require.ErrorIs(t, e.p.Close(), memapi.ErrInUse)
	require.NoError(t, b.Free())
	require.NoError(t, e.p.Close())
	_, err = e.p.Alloc(ctx, 100, nil)
	require.ErrorIs(t, err, memapi.ErrClosed)
	e.drain(t)
	require.Zero(t, e.m.UsedBytes())
	require.Zero(t, e.holder("pool").Charged)
}

// TestStreamOrderedReuse: a block freed behind a fence is reused at once on
// its own stream, never on another before the fence completes.
func TestStreamOrderedReuse(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	s1, s2 := e.stream(t), e.stream(t)

	// Drain the shards so reuse can only come through the pending list.
	b, err := e.p.Alloc(ctx, 4096, s1)
	require.NoError(t, err)
	f, err := s1.Record()
	require.NoError(t, err)
	require.NoError(t, b.RecordUse(f))
	require.NoError(t, b.Free())
	require.Equal(t, ep.Pending, b.State())
	st := e.p.Stats()
	require.Equal(t, memapi.Bytes(4096), st.Pending)
	e.checkLedger(t) // a pending block is cached, not in use

	// Another stream gets other memory however many it asks for.
	var others []pool.Block
	for range 2000 {
		o, err := e.p.Alloc(ctx, 4096, s2)
		require.NoError(t, err)
		require.NotEqual(t, b.Addr(), o.Addr(), "reused on another stream before its fence")
		others = append(others, o)
	}
	// Its own stream takes it back once the shards are dry.
	var mine []pool.Block
	found := false
	for range 4000 {
		o, err := e.p.Alloc(ctx, 4096, s1)
		require.NoError(t, err)
		mine = append(mine, o)
		if o.Addr() == b.Addr() {
			found = true
			break
		}
	}
	require.True(t, found, "a pending block is reusable at once on its own stream")
	require.Equal(t, uint64(1), e.p.Stats().StreamReuse)
	for _, o := range append(others, mine...) {
		require.NoError(t, o.Free())
	}
	e.fctx.CompleteAll()
	e.checkLedger(t)
}

// TestPendingSegmentWaitsForFence: a segment whose blocks are pending is not
// given back before their fences; Close releases it behind them.
func TestPendingSegmentWaitsForFence(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	s1 := e.stream(t)
	b, err := e.p.Alloc(ctx, 3<<20, s1)
	require.NoError(t, err)
	f, err := s1.Record()
	require.NoError(t, err)
	require.NoError(t, b.RecordUse(f))
	require.NoError(t, b.Free())
	n, err := e.p.Trim(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a segment behind an incomplete fence stays")
	require.NoError(t, e.p.Close())
	require.NotZero(t, e.m.UsedBytes(), "freed only after the fence")
	e.fctx.CompleteAll()
	e.drain(t)
	require.Zero(t, e.m.UsedBytes())
	require.Zero(t, e.holder("pool").Charged)
}

// TestStreamUseForbidsOwnStream: a block whose fences include another
// stream's work (RecordStreamUse) is not reused even on its own stream
// before they complete, then is.
func TestStreamUseForbidsOwnStream(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	s1, s2 := e.stream(t), e.stream(t)
	b, err := e.p.Alloc(ctx, 4096, s1)
	require.NoError(t, err)
	own, err := s1.Record()
	require.NoError(t, err)
	other, err := s2.Record()
	require.NoError(t, err)
	require.NoError(t, b.RecordUse(own))
	require.NoError(t, b.RecordStreamUse(other))
	require.NoError(t, b.Free())
	var mine []pool.Block
	for range 4000 {
		o, err := e.p.Alloc(ctx, 4096, s1)
		require.NoError(t, err)
		require.NotEqual(t, b.Addr(), o.Addr(), "reused on its own stream before the other stream's fence")
		mine = append(mine, o)
	}
	require.Zero(t, e.p.Stats().StreamReuse)
	freeAll(t, mine)
	e.fctx.CompleteAll()
	n, err := e.p.Trim(ctx)
	require.NoError(t, err)
	require.NotZero(t, n)
	s := e.checkLedger(t)
	require.Zero(t, s.Pending)
}
