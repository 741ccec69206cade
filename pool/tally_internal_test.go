package pool

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

// TestTallyCapsAddUpToThePeaks: after concurrent Allocs and Frees of every
// size, the invariant the fast path relies on holds: each shard's share is
// at or under its caps and the caps add up to the peaks (so no share can
// rise past its cap without the totals passing the peaks first), and the
// shares add up to what the caller holds.
func TestTallyCapsAddUpToThePeaks(t *testing.T) {
	const a = memapi.AuthorityID("dev")
	m := fakes.NewMechanism(fakes.Config{Authority: a, Offers: memapi.Of(memapi.CapDeviceAllocator)})
	ectx := ep.NewContext(fakes.NewContext(m), ep.Options{})
	g := governor.New(governor.Options{})
	require.NoError(t, g.AddAuthority(a, 1<<30))
	mgr := pmm.New(pmm.GovernorLedger(g), pmm.Options{})
	dev := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	require.NoError(t, mgr.Register(pmm.Device{Key: dev, Mechanism: m, Context: ectx, Authority: a}))
	b, err := mgr.Bind("pool", "workspace", dev)
	require.NoError(t, err)
	p, err := New(b, Options{})
	require.NoError(t, err)
	require.NoError(t, g.Register("pool", p, governor.HolderOptions{Cache: true}))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, p.Close())
		require.NoError(t, mgr.Close(ctx))
		require.NoError(t, ectx.Close(ctx, true))
		require.NoError(t, g.Close())
	}()
	check := func(wantUse, wantReq int64) {
		p.lockShards()
		defer p.unlockShards()
		var caps, reqCaps int64
		for i := range p.shards {
			tl := p.shards[i].t
			require.LessOrEqual(t, tl.use, tl.useCap, "shard %d's share is over its cap", i)
			require.LessOrEqual(t, tl.req, tl.reqCap, "shard %d's requested share is over its cap", i)
			caps += tl.useCap
			reqCaps += tl.reqCap
		}
		require.Equal(t, p.peakUse, caps, "the caps add up to the peak")
		require.Equal(t, p.peakReq, reqCaps)
		use, req := p.totalsLocked()
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
	wg.Wait()
	check(use, req)
	for _, blk := range live {
		require.NoError(t, blk.Free())
	}
	check(0, 0)
}
