package pool

import (
	"context"
	"errors"
	"math"

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
// that growth may be the reservation that asked). A ticket answered short
// is paid on while its reservation waits (ctx, which the governor ends
// with the wait; a context that cannot end leaves no debt): a segment that
// a free then makes wholly free is given back at once (debt.go).
func (p *Pool) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	freed, err := p.trim(ctx, uint64(t.Wanted))
	if freed < t.Wanted && ctx.Done() != nil && ctx.Err() == nil && !p.closed.Load() {
		p.segs.owe(ctx, uint64(t.Wanted-freed))
	}
	return freed, err
}

// Trim gives back every cached segment that is wholly free (BackingRegion:
// the region's free tail), like the caching allocator's empty_cache, and
// reports the bytes.
func (p *Pool) Trim(ctx context.Context) (memapi.Bytes, error) { return p.trim(ctx, math.MaxUint64) }

// trim composes the levels' giving back: the failed releases retried, the
// cache gathered (the depot's compact: pending blocks whose fences
// completed, the shards' free blocks, the wholly free slabs back to the
// arena), then wholly free segments closed (arena.giveBack), then the
// region's free tail and holes (arena.trimRegion), until wanted bytes.
func (p *Pool) trim(ctx context.Context, wanted uint64) (memapi.Bytes, error) {
	rerr := p.segs.retry(ctx)
	if !p.depot.compact() {
		return 0, rerr
	}
	freed, cerr, closed := p.arena.giveBack(wanted)
	if closed {
		return 0, rerr
	}
	errs := []error{rerr, cerr}
	if p.segs.rseg != nil && freed < wanted {
		n, err := p.arena.trimRegion(ctx, wanted-freed)
		freed += n
		errs = append(errs, err)
	}
	if freed > 0 {
		p.segs.countReclaim(freed)
	}
	return memapi.Bytes(freed), errors.Join(errs...)
}
