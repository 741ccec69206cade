package pool_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestBackingChoice: a mechanism with VirtualBacking gets one region, one
// without gets segments, and Stats says which.
func TestBackingChoice(t *testing.T) {
	e := setupWith(t, 1<<30, pool.Options{}, fakes.Config{})
	require.Equal(t, pool.BackingRegion, e.p.Stats().Backing)
	o := setupWith(t, 1<<30, pool.Options{}, fakes.Config{Offers: memapi.Of(memapi.CapDeviceAllocator)})
	require.Equal(t, pool.BackingSegments, o.p.Stats().Backing)
	_, err := pool.New(o.p.Binding(), pool.Options{Backing: pool.BackingRegion})
	require.ErrorIs(t, err, memapi.ErrUnsupported)
}

// TestRegionGrowsAndTrimsTail: the region grows at its end at a fixed
// address; a ticket decommits the free tail and the whole free granules of
// the holes inside it (holes.go), never a block in use.
func TestRegionGrowsAndTrimsTail(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{Backing: pool.BackingRegion, SegmentBytes: 1 << 20})
	ctx := context.Background()
	a := allocAll(t, e.p, 4, 3<<20)
	b := allocAll(t, e.p, 4, 3<<20)
	s := e.checkLedger(t)
	require.Equal(t, 1, s.NumSegments)
	require.GreaterOrEqual(t, s.Segments, memapi.Bytes(24<<20))
	require.Equal(t, a[0].Addr()+memapi.DeviceAddr(3<<20), a[1].Addr(), "one contiguous range")
	freeAll(t, a) // a hole in the middle: decommitted after the tail
	n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 1 << 30})
	require.NoError(t, err)
	tailBefore := s.Segments - 24<<20
	require.Equal(t, tailBefore+12<<20, n, "the free tail and the hole go")
	s = e.checkLedger(t)
	require.Equal(t, memapi.Bytes(12<<20), s.Segments)
	require.Equal(t, memapi.Bytes(12<<20), s.Decommitted)
	require.Equal(t, memapi.Bytes(12<<20), e.m.UsedBytes())
	freeAll(t, b)
	n, err = e.p.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(12<<20), n)
	require.Zero(t, e.checkLedger(t).Decommitted)
	require.Zero(t, e.checkLedger(t).Segments)
	c := allocAll(t, e.p, 1, 5<<20)
	require.Equal(t, a[0].Addr(), c[0].Addr(), "the address never moves")
	freeAll(t, c)
}

// TestReclaimCutsTheTailToWhatIsAsked: a ticket for less than the region's
// free tail gets the tail's last granules holding what it asked (at least
// that, less than a granule more), not the whole tail, so the next growth
// need not commit back what nobody asked for; a second ticket and Trim
// take the rest, every byte once.
func TestReclaimCutsTheTailToWhatIsAsked(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{Backing: pool.BackingRegion, SegmentBytes: 1 << 20})
	ctx := context.Background()
	gran := memapi.Bytes(64 << 10) // the fake mechanism's granularity
	keep := allocAll(t, e.p, 1, 1<<20)
	tail := allocAll(t, e.p, 8, 1<<20)
	held := e.checkLedger(t).Segments
	freeAll(t, tail)
	ask := 100 << 10
	n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: memapi.Bytes(ask)})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, memapi.Bytes(ask))
	require.Less(t, n, memapi.Bytes(ask)+gran, "about what was asked, not the whole free tail")
	s := e.checkLedger(t)
	require.Equal(t, held-n, s.Segments)
	require.Equal(t, held-n, e.m.UsedBytes())
	n2, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 3 << 20})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n2, memapi.Bytes(3<<20))
	require.Less(t, n2, memapi.Bytes(3<<20)+gran)
	rest, err := e.p.Trim(ctx)
	require.NoError(t, err)
	s = e.checkLedger(t)
	require.Equal(t, held, n+n2+rest+s.Segments, "every byte given back once")
	require.Equal(t, memapi.Bytes(1<<20), s.Segments, "the block in use and nothing else")
	freeAll(t, keep)
}

// TestTrimCutsATailThatStartsMidGranule: the region's free tail starts
// inside a granule (a block ends there). Trim cuts the tail from the next
// granule on, the length rounded up past the block, never down into it: the
// region shrinks (nothing decommitted in place), the granule the block
// shares stays committed, and the block keeps its bytes.
func TestTrimCutsATailThatStartsMidGranule(t *testing.T) {
	e := setupWith(t, 1<<30, pool.Options{Backing: pool.BackingRegion, SegmentBytes: 1 << 20}, fakes.Config{Granularity: 64 << 10})
	ctx := context.Background()
	b, err := e.p.Alloc(ctx, 96<<10, nil) // a large block: [0, 96 KiB), the tail from mid-granule 1
	require.NoError(t, err)
	require.NoError(t, e.m.WriteMemory(b.Addr(), pattern(7, 96<<10)))
	before := e.checkLedger(t)
	require.Equal(t, memapi.Bytes(1<<20), before.Segments)
	n, err := e.p.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(1<<20-128<<10), n, "the tail from the granule after the block's end")
	s := e.checkLedger(t)
	require.Equal(t, memapi.Bytes(128<<10), s.Segments, "the two granules the block touches")
	require.Zero(t, s.Decommitted, "the tail was cut, not decommitted in place")
	got := make([]byte, 96<<10)
	require.NoError(t, e.m.ReadMemory(b.Addr(), got))
	require.Equal(t, pattern(7, 96<<10), got)
	require.NoError(t, b.Free())
}
