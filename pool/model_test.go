package pool_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// live is the model's record of one block in use.
type live struct {
	b    pool.Block
	size memapi.Bytes
	seed int
}

// TestPoolModel runs random Alloc, Free, double and foreign Free, Reclaim and
// Trim against a reference model, with faults injected into the segment
// steps (the mechanism's Allocate). It checks that live blocks never overlap
// (a pattern written per block is intact at its Free), alignment, that
// Stats equal the model's figures, the ledger identity after every step,
// that a failed step changes nothing, and that all is zero after Close.
func TestPoolModel(t *testing.T) {
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) { poolModel(t, backing) })
	}
}

func poolModel(t *testing.T, backing pool.Backing) {
	rapid.Check(t, func(rt *rapid.T) {
		e := setup(t, 96<<20, pool.Options{SegmentBytes: 2 << 20, SlabBytes: 256 << 10, Backing: backing, Wait: 10 * time.Millisecond})
		require.Equal(t, backing, e.p.Stats().Backing)
		ctx := context.Background()
		faultRate := rapid.SampledFrom([]int{0, 5, 25}).Draw(rt, "faultRate")
		calls := 0
		method := "Allocate"
		if backing == pool.BackingRegion {
			method = "Commit"
		}
		e.m.Inject(fakes.Fault{Method: method, When: func(fakes.Call) bool {
			calls++
			return faultRate > 0 && calls%100 < faultRate
		}, Err: memapi.ErrOutOfMemory})
		var blocks []live
		var inUse, requested, peakReq memapi.Bytes
		var allocs, frees uint64
		seed := 0
		sizes := rapid.OneOf(rapid.Uint64Range(1, 4096), rapid.Uint64Range(4097, 1<<20), rapid.Uint64Range(1<<20+1, 6<<20))
		steps := rapid.IntRange(20, 200).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0, 1, 2, 3, 4:
				n := memapi.Bytes(sizes.Draw(rt, "size"))
				before := e.p.Stats()
				b, err := e.p.Alloc(ctx, n, nil)
				if err != nil {
					// Injected faults, or the budget (96 MiB) when the
					// live blocks fill it: both change nothing.
					require.True(t, errors.Is(err, memapi.ErrOutOfMemory) || errors.Is(err, memapi.ErrOverBudget), "unexpected error %v", err)
					after := e.p.Stats()
					require.Equal(t, before.Segments, after.Segments)
					require.Equal(t, before.InUse, after.InUse)
					require.Equal(t, before.Allocs, after.Allocs)
					break
				}
				require.Zero(t, uint64(b.Addr())%pool.Alignment, "alignment")
				require.GreaterOrEqual(t, b.Rounded(), n)
				seed++
				require.NoError(t, e.m.WriteMemory(b.Addr(), pattern(seed, int(min(n, 4096)))))
				if n >= 8192 {
					require.NoError(t, e.m.WriteMemory(b.Addr()+memapi.DeviceAddr(n-4096), pattern(-seed, 4096)))
				}
				blocks = append(blocks, live{b, n, seed})
				inUse += b.Rounded()
				requested += n
				peakReq = max(peakReq, requested)
				allocs++
			case 5, 6, 7:
				if len(blocks) == 0 {
					break
				}
				i := rapid.IntRange(0, len(blocks)-1).Draw(rt, "i")
				l := blocks[i]
				got := make([]byte, min(l.size, 4096))
				require.NoError(t, e.m.ReadMemory(l.b.Addr(), got))
				require.True(t, bytes.Equal(pattern(l.seed, len(got)), got), "block %d at %#x (%d bytes) was overwritten", l.seed, l.b.Addr(), l.size)
				if l.size >= 8192 {
					require.NoError(t, e.m.ReadMemory(l.b.Addr()+memapi.DeviceAddr(l.size-4096), got))
					require.True(t, bytes.Equal(pattern(-l.seed, 4096), got), "the end of block %d was overwritten", l.seed)
				}
				require.NoError(t, l.b.Free())
				require.ErrorIs(t, l.b.Free(), pool.ErrDoubleFree)
				blocks = append(blocks[:i], blocks[i+1:]...)
				inUse -= l.b.Rounded()
				requested -= l.size
				frees++
			case 8:
				want := memapi.Bytes(rapid.Uint64Range(1, 64<<20).Draw(rt, "wanted"))
				before := e.p.Stats()
				n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: want})
				require.NoError(t, err)
				if before.Cached >= want && n < want {
					// Only wholly free segments go: a cache of partly used
					// segments may hold the bytes yet give fewer.
					require.LessOrEqual(t, n, before.Cached)
				}
				require.LessOrEqual(t, n, before.Cached, "never more than the cache")
			case 9:
				_, err := e.p.Trim(ctx)
				require.NoError(t, err)
			}
			s := e.checkLedger(t)
			require.Equal(t, inUse, s.InUse)
			require.Equal(t, requested, s.Requested)
			require.Equal(t, peakReq, s.PeakRequested)
			require.Equal(t, allocs, s.Allocs)
			require.Equal(t, frees, s.Frees)
			require.Equal(t, len(blocks) == 0, s.InUse == 0)
		}
		for _, l := range blocks {
			require.NoError(t, l.b.Free())
		}
		e.m.ClearFaults()
		require.NoError(t, e.p.Close())
		e.drain(t)
		require.Zero(t, e.m.UsedBytes())
		require.Zero(t, e.holder("pool").Charged)
		require.Zero(t, e.p.Stats().Segments)
		_ = errors.New
	})
}
