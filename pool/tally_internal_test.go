package pool

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/stretchr/testify/require"
)

// TestTallyCapsAddUpToThePeaks: after concurrent Allocs and Frees of every
// size, the invariant the fast path relies on holds: each shard's share is
// at or under its caps and the caps add up to the peaks (so no share can
// rise past its cap without the totals passing the peaks first), and the
// shares add up to what the caller holds.
func TestTallyCapsAddUpToThePeaks(t *testing.T) {
	p := newTestPool(t)
	check := func(wantUse, wantReq int64) {
		ss := &p.shards
		ss.lockAll()
		defer ss.unlockAll()
		var caps, reqCaps int64
		for i := range ss.s {
			tl := ss.s[i].t
			require.LessOrEqual(t, tl.use, tl.useCap, "shard %d's share is over its cap", i)
			require.LessOrEqual(t, tl.req, tl.reqCap, "shard %d's requested share is over its cap", i)
			caps += tl.useCap
			reqCaps += tl.reqCap
		}
		require.Equal(t, ss.peakUse, caps, "the caps add up to the peak")
		require.Equal(t, ss.peakReq, reqCaps)
		use, req := ss.totalsLocked()
		require.Equal(t, wantUse, use)
		require.Equal(t, wantReq, req)
	}
	ctx := context.Background()
	var mu sync.Mutex
	var live []Block
	var use, req int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range 3000 {
				mu.Lock()
				if len(live) > 0 && r.IntN(2) == 0 {
					i := r.IntN(len(live))
					blk := live[i]
					live[i] = live[len(live)-1]
					live = live[:len(live)-1]
					use -= int64(blk.Rounded())
					req -= int64(blk.Size())
					mu.Unlock()
					if err := blk.Free(); err != nil {
						t.Error(err)
					}
					continue
				}
				mu.Unlock()
				n := memapi.Bytes(1 + r.Uint64N(96<<10)) // small and large
				blk, err := p.Alloc(ctx, n, nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				live = append(live, blk)
				use += int64(blk.Rounded())
				req += int64(n)
				mu.Unlock()
			}
		}()
	}
	watchdog.Within(t, watchdog.Bound, "the workers", wg.Wait)
	check(use, req)
	for _, blk := range live {
		require.NoError(t, blk.Free())
	}
	check(0, 0)
}
