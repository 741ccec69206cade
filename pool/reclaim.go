package pool

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// Reclaim is the pool's answer to a pressure ticket (governor.Holder). It
// gives back cached memory only: pending blocks whose fences completed join
// the cache, slabs whose every block is free go back to the arena, and
// segments that are then wholly free are closed (their pmm lifecycle frees
// them behind any fences and refunds the lease) until t.Wanted bytes are
// freed or none is left; with BackingRegion the last granules of the
// region's free tail that hold t.Wanted bytes are decommitted
// (Region.Shrink, behind the region's fences), then the whole free
// granules inside the region (Region.Decommit, holes.go). It never touches
// a block in use and may free 0 (always while the pool's own region grows:
// that growth may be the reservation that asked).
func (p *Pool) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	return p.trim(ctx, uint64(t.Wanted))
}

// Trim gives back every cached segment that is wholly free (BackingRegion:
// the region's free tail), like the caching allocator's empty_cache, and
// reports the bytes.
func (p *Pool) Trim(ctx context.Context) (memapi.Bytes, error) { return p.trim(ctx, math.MaxUint64) }

func (p *Pool) trim(ctx context.Context, wanted uint64) (memapi.Bytes, error) {
	rerr := p.retryReleases(ctx)
	freed, cerr, closed := p.trimCache(wanted)
	if closed {
		return 0, rerr
	}
	errs := []error{rerr, cerr}
	if p.opts.Backing == BackingRegion && freed < wanted {
		n, err := p.regionTrim(ctx, wanted-freed)
		freed += n
		errs = append(errs, err)
	}
	if freed > 0 {
		p.segs.countReclaim(freed)
	}
	return memapi.Bytes(freed), errors.Join(errs...)
}

// trimCache gathers the cache (the pending blocks whose fences completed,
// the shards' free blocks, the wholly free slabs) and, with
// BackingSegments, closes wholly free segments (largest first: the fewest
// releases for the bytes asked) until wanted bytes. It holds the depot's,
// the arena's and the segments' locks.
func (p *Pool) trimCache(wanted uint64) (freed uint64, err error, closed bool) {
	d, a, g := &p.depot, &p.arena, &p.segs
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed.Load() {
		return 0, nil, true
	}
	p.sweep()
	a.mu.Lock()
	defer a.mu.Unlock()
	p.flushShards()
	p.freeSlabs()
	g.mu.Lock()
	defer g.mu.Unlock()
	var segs []*segment
	var errs []error
	for s := range g.all {
		if s.wholeFree() {
			segs = append(segs, s)
		}
	}
	slices.SortFunc(segs, func(x, y *segment) int {
		if x.size != y.size {
			return cmp.Compare(y.size, x.size)
		}
		return cmp.Compare(x.base, y.base)
	})
	for _, s := range segs {
		if freed >= wanted {
			break
		}
		if s.huge {
			i := slices.Index(g.huge, s.head)
			g.huge = slices.Delete(g.huge, i, i+1)
		} else {
			a.remove(s.head)
		}
		freed += s.size
		errs = append(errs, g.drop(s))
	}
	return freed, errors.Join(errs...), false
}

// flushShards moves every shard's free blocks to the depot. The caller
// holds the depot's lock.
func (p *Pool) flushShards() {
	for i := range p.shards {
		p.flushShard(&p.shards[i])
	}
}

func (p *Pool) flushShard(sh *shard) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for c := range sh.lists {
		for b := sh.lists[c].pop(); b != nil; b = sh.lists[c].pop() {
			p.depot.put(b)
		}
	}
}

// freeSlabs gives the chunks of slabs whose every block is in the depot
// back to the arena. The caller holds the depot's and the arena's locks.
func (p *Pool) freeSlabs() {
	for _, ch := range p.depot.wholeSlabs() {
		p.arena.give(ch)
	}
}
