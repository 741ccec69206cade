package pool

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGrowthAfterAFittingFreeDoesNotGrow: a chunk that fits, freed
// between a request's miss and its growth (before the growth registers
// as a grower, so no wake can reach it), means no growth: grow returns
// without adding a segment and the request takes the chunk.
func TestGrowthAfterAFittingFreeDoesNotGrow(t *testing.T) {
	p := newTestPool(t)
	ctx := context.Background()
	const n = 1 << 20
	a, err := p.Alloc(ctx, n, nil)
	require.NoError(t, err)
	b, err := p.Alloc(ctx, n, nil)
	require.NoError(t, err)
	before := p.Stats()
	require.Equal(t, uint64(1), before.SegmentAllocs, "one segment holds both")

	p.arena.mu.Lock()
	ch, busy, miss := p.arena.take(n)
	p.arena.mu.Unlock()
	require.Nil(t, ch, "the segment is full: a miss")
	require.False(t, busy)

	require.NoError(t, a.Free()) // a chunk that fits, before the growth
	require.NoError(t, p.arena.grow(ctx, n, miss))
	require.Equal(t, before.SegmentAllocs, p.Stats().SegmentAllocs, "grew though a chunk that fits was free")

	c, err := p.Alloc(ctx, n, nil)
	require.NoError(t, err)
	require.Equal(t, before.SegmentAllocs, p.Stats().SegmentAllocs)
	require.NoError(t, b.Free())
	require.NoError(t, c.Free())
}
