package pool

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStealFromIdleShards: free blocks that another shard keeps (its P went
// quiet, or the goroutine that freed them moved to another P) are taken before a
// new slab is carved.
func TestStealFromIdleShards(t *testing.T) {
	p := newTestPool(t)
	p.shards.s, p.shards.mask = make([]shard, 4), 3 // more shards than this machine may have Ps
	ctx := context.Background()
	const size = 4096
	c := classOf(size)
	k := slabCount(c, uint64(p.opts.SlabBytes))
	var blocks []Block
	for range k { // one whole slab
		blk, err := p.Alloc(ctx, size, nil)
		require.NoError(t, err)
		blocks = append(blocks, blk)
	}
	for _, blk := range blocks {
		require.NoError(t, blk.Free())
	}
	require.Equal(t, uint64(1), p.Stats().Slabs)
	// Every free block of the class to the last shard, nothing in the
	// depot, and the caller on the first (one P, so pick names shard 0).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	func() {
		p.depot.mu.Lock()
		defer p.depot.mu.Unlock()
		for i := range p.shards.s {
			p.depot.pull(&p.shards.s[i], -1)
		}
		last := &p.shards.s[len(p.shards.s)-1]
		for b := p.depot.lists[c].pop(); b != nil; b = p.depot.lists[c].pop() {
			last.lists[c].push(b)
		}
	}()
	require.Same(t, &p.shards.s[0], p.shards.pick())
	for range k {
		blk, err := p.Alloc(ctx, size, nil)
		require.NoError(t, err)
		blocks = append(blocks[:0], blk)
		require.NoError(t, blk.Free())
	}
	require.Equal(t, uint64(1), p.Stats().Slabs, "the idle shard's blocks were used, no new slab")
}
