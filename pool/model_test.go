package pool_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
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
// steps: the growth (the mechanism's Allocate, or Commit for the region) and
// the release (Free, or Decommit). It checks that live blocks never overlap
// (a pattern written per block is intact at its Free), alignment, that
// Stats equal the model's figures, the ledger identity after every step
// (checkLedger: a failed release stays charged, quarantined and visible in
// Stats), that a failed growth changes nothing, that all is zero after Close
// once a retry released what had failed, and that no step or cleanup hangs
// (within).
func TestPoolModel(t *testing.T) {
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) { poolModel(t, backing) })
	}
}

// rateFault injects err into every call of method whose turn (a count of
// its calls, mod 100) is below the rate.
func rateFault(method string, rate int, err error) fakes.Fault {
	var calls atomic.Int64 // predicates run outside the fake's lock, on any goroutine
	return fakes.Fault{Method: method, When: func(fakes.Call) bool {
		return rate > 0 && int(calls.Add(1)%100) < rate
	}, Err: err}
}

// noErrorButQuarantine: a Trim, Reclaim or Close may report that a retried
// release failed again (an injected release fault); nothing else.
func noErrorButQuarantine(t require.TestingT, err error) {
	if err != nil {
		require.ErrorIs(t, err, ep.ErrQuarantined)
	}
}

func poolModel(t *testing.T, backing pool.Backing) {
	var heavy, sawAny int // checks with 50 % release faults, and of them those that saw a quarantined release
	var decommits, recommits uint64
	rapid.Check(t, func(rt *rapid.T) {
		// The region's holes (holes.go): whole free granules decommitted
		// before every rise of the committed bytes (a slack of almost 0),
		// beyond a slack of 1/20, or only by Reclaim and Trim (0, the
		// default).
		slack := rapid.SampledFrom([]float64{1e-9, 1.0 / 20, 0}).Draw(rt, "holeSlack")
		e := setupWith(rt, 96<<20, pool.Options{SegmentBytes: 2 << 20, SlabBytes: 256 << 10, HugeBytes: 4 << 20, Backing: backing,
			Wait: 10 * time.Millisecond, HoleSlack: slack}, fakes.Config{Granularity: 64 << 10})
		require.Equal(rt, backing, e.p.Stats().Backing)
		ctx := context.Background()
		growRate := rapid.SampledFrom([]int{0, 5, 25}).Draw(rt, "growFaults")
		releaseRate := rapid.SampledFrom([]int{0, 10, 50}).Draw(rt, "releaseFaults")
		// Both backings use both: a region pool's huge segments are
		// Buffers.
		for _, m := range []string{"Allocate", "Commit"} {
			e.m.Inject(rateFault(m, growRate, memapi.ErrOutOfMemory))
		}
		for _, m := range []string{"Free", "Decommit"} {
			e.m.Inject(rateFault(m, releaseRate, memapi.ErrUnavailable))
		}
		sawQuarantine := false
		var blocks []live
		var inUse, requested, peakUse, peakReq memapi.Bytes
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
					// Injected growth faults, the budget (96 MiB) when the
					// live blocks fill it, or a region whose quarantined
					// backing could not be removed before it grew: none
					// changes what is in use. Only cache may have gone
					// (free huge segments that fit no request are closed
					// before a huge growth, and an over-budget growth trims
					// the pool's cache).
					require.True(rt, errors.Is(err, memapi.ErrOutOfMemory) || errors.Is(err, memapi.ErrOverBudget) ||
						errors.Is(err, ep.ErrQuarantined), "unexpected error %v", err)
					after := e.p.Stats()
					require.Equal(rt, before.Segments-after.Segments, before.Cached-after.Cached, "a failed growth gave back cache only")
					require.Equal(rt, before.InUse, after.InUse)
					require.Equal(rt, before.Requested, after.Requested)
					require.Equal(rt, before.Allocs, after.Allocs)
					break
				}
				require.Zero(rt, uint64(b.Addr())%pool.Alignment, "alignment")
				require.GreaterOrEqual(rt, b.Rounded(), n)
				seed++
				require.NoError(rt, e.m.WriteMemory(b.Addr(), pattern(seed, int(min(n, 4096)))))
				if n >= 8192 {
					require.NoError(rt, e.m.WriteMemory(b.Addr()+memapi.DeviceAddr(n-4096), pattern(-seed, 4096)))
				}
				blocks = append(blocks, live{b, n, seed})
				inUse += b.Rounded()
				requested += n
				peakReq = max(peakReq, requested)
				peakUse = max(peakUse, inUse)
				allocs++
			case 5, 6, 7:
				if len(blocks) == 0 {
					break
				}
				i := rapid.IntRange(0, len(blocks)-1).Draw(rt, "i")
				l := blocks[i]
				got := make([]byte, min(l.size, 4096))
				require.NoError(rt, e.m.ReadMemory(l.b.Addr(), got))
				require.True(rt, bytes.Equal(pattern(l.seed, len(got)), got), "block %d at %#x (%d bytes) was overwritten", l.seed, l.b.Addr(), l.size)
				if l.size >= 8192 {
					require.NoError(rt, e.m.ReadMemory(l.b.Addr()+memapi.DeviceAddr(l.size-4096), got))
					require.True(rt, bytes.Equal(pattern(-l.seed, 4096), got), "the end of block %d was overwritten", l.seed)
				}
				require.NoError(rt, l.b.Free())
				require.ErrorIs(rt, l.b.Free(), pool.ErrDoubleFree)
				blocks = append(blocks[:i], blocks[i+1:]...)
				inUse -= l.b.Rounded()
				requested -= l.size
				frees++
			case 8:
				want := memapi.Bytes(rapid.Uint64Range(1, 64<<20).Draw(rt, "wanted"))
				before := e.p.Stats()
				n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: want})
				noErrorButQuarantine(rt, err)
				if before.Cached >= want && n < want {
					// Only wholly free segments go: a cache of partly used
					// segments may hold the bytes yet give fewer.
					require.LessOrEqual(rt, n, before.Cached)
				}
				require.LessOrEqual(rt, n, before.Cached, "never more than the cache")
			case 9:
				_, err := e.p.Trim(ctx)
				noErrorButQuarantine(rt, err)
			}
			s := e.checkLedger(t)
			require.Equal(rt, inUse, s.InUse)
			require.Equal(rt, requested, s.Requested)
			require.Equal(rt, peakReq, s.PeakRequested)
			require.Equal(rt, peakUse, s.PeakInUse)
			require.Equal(rt, allocs, s.Allocs)
			require.Equal(rt, frees, s.Frees)
			require.Equal(rt, len(blocks) == 0, s.InUse == 0)
		}
		for _, l := range blocks {
			require.NoError(rt, l.b.Free())
		}
		// Close with the release faults still on: what fails stays
		// charged, quarantined, in Stats; Close again retries it.
		require.NoError(rt, e.p.Close())
		for range 100 {
			s := e.checkLedger(rt)
			require.Zero(rt, s.Segments)
			if s.Quarantined == 0 {
				break
			}
			sawQuarantine = true
			if rapid.Bool().Draw(rt, "clear faults") {
				e.m.ClearFaults()
			}
			noErrorButQuarantine(rt, e.p.Close())
		}
		e.m.ClearFaults()
		require.NoError(rt, e.p.Close())
		s := e.checkLedger(rt)
		decommits += s.Decommits
		recommits += s.Recommits
		require.Zero(rt, s.Decommitted)
		require.Zero(rt, s.Quarantined)
		require.Zero(rt, e.m.UsedBytes())
		require.Zero(rt, e.holder("pool").Charged)
		require.Zero(rt, e.holder("pool").Quarantined)
		require.Zero(rt, s.Segments)
		if releaseRate >= 50 {
			heavy++
			if sawQuarantine {
				sawAny++
			}
		}
	})
	t.Logf("%s: %d decommit passes, %d recommits", backing, decommits, recommits)
	if backing == pool.BackingRegion && (decommits == 0 || recommits == 0) {
		t.Error("the region's holes were not exercised: no decommit or no recommit")
	}
	if heavy >= 10 { // a short run (-rapid.checks) may draw too few to tell
		require.NotZero(t, sawAny, "no check saw a quarantined release: the release faults were not exercised")
	}
}
