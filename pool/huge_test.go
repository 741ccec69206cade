package pool_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestHugeSegmentsNotSplit: a huge block's segment, once free, is not split
// by smaller requests: the same huge request a run later gets it back, and
// the pool does not grow for it.
func TestHugeSegmentsNotSplit(t *testing.T) {
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) {
			e := setup(t, 1<<30, pool.Options{Backing: backing})
			ctx := context.Background()
			// The smaller blocks' memory is cached first: serving them
			// again needs no growth (before which a free huge segment
			// would go back).
			freeAll(t, allocAll(t, e.p, 40, 300<<10))
			huge, err := e.p.Alloc(ctx, 17<<20, nil)
			require.NoError(t, err)
			require.NoError(t, huge.Free())
			before := e.checkLedger(t)
			// A run of smaller requests that the cached huge segment
			// would hold: they get the arena's memory.
			mid := allocAll(t, e.p, 40, 300<<10)
			for _, b := range mid {
				require.False(t, b.Addr() >= huge.Addr() && b.Addr() < huge.Addr()+17<<20, "a smaller block split the huge segment")
			}
			again, err := e.p.Alloc(ctx, 17<<20, nil)
			require.NoError(t, err)
			require.Equal(t, huge.Addr(), again.Addr(), "the huge segment served the same request again")
			s := e.checkLedger(t)
			require.Equal(t, before.SegmentAllocs, s.SegmentAllocs, "no growth")
			require.NoError(t, again.Free())
			freeAll(t, mid)
			e.checkLedger(t)
		})
	}
}

// TestHugeMisfitClosedBeforeGrowth: a free huge segment that fits no huge
// request goes back before another huge segment is allocated, so the peak
// never holds both; one that fits (at most half of it unused) is reused,
// and a free huge segment stays while the region grows.
func TestHugeMisfitClosedBeforeGrowth(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{Backing: pool.BackingRegion})
	ctx := context.Background()
	b, err := e.p.Alloc(ctx, 32<<20, nil)
	require.NoError(t, err)
	require.NoError(t, b.Free())
	b, err = e.p.Alloc(ctx, 17<<20, nil) // at least half of it: reused
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(32<<20), b.Rounded())
	require.NoError(t, b.Free())
	s := e.checkLedger(t)
	require.Equal(t, memapi.Bytes(32<<20), s.Segments)
	require.Equal(t, uint64(1), s.SegmentAllocs)

	b, err = e.p.Alloc(ctx, 12<<20, nil) // 32 MiB is too big for it: closed first
	require.NoError(t, err)
	s = e.checkLedger(t)
	require.Equal(t, memapi.Bytes(12<<20), s.Segments)
	require.Equal(t, memapi.Bytes(32<<20), s.PeakSegments, "never 32 + 12 MiB at once")
	require.NoError(t, b.Free())
	small, err := e.p.Alloc(ctx, 1<<20, nil) // the region grows; the huge segment stays
	require.NoError(t, err)
	s = e.checkLedger(t)
	require.Equal(t, memapi.Bytes(12<<20+2<<20), s.Segments)
	require.NoError(t, small.Free())
	again, err := e.p.Alloc(ctx, 12<<20, nil)
	require.NoError(t, err)
	require.Equal(t, b.Addr(), again.Addr())
	require.NoError(t, again.Free())
}
