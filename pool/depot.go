package pool

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// The pool's levels, each a type with its own lock that owns its work and
// refills only from the level below it, in the manner of Go's runtime
// (mcache → mcentral → mheap):
//
//	shards    the caller's P's cache of free small blocks (shard.go): the fast path; refill from the depot
//	depot     free small blocks per size class, and blocks pending behind fences; carves slabs from the arena
//	arena     the best-fit index of the free chunks of every segment (arena.go); grows from the segments
//	holes     the region's decommitted granules (holes.go): commits a chunk the arena hands out, decommits free ones
//	segments  the backing (segments.go, region.go, huge.go): Buffers and the region, from pmm; huge blocks
//
// Lock order: the segments' growMu (the region's transactions, held across
// pmm calls, never under a level's lock) → depot.mu → arena.mu → holes.mu →
// segments.mu → the shards' locks (in index order). A path takes only the
// levels it touches, in that order, each unlocked by defer (but for the
// arithmetic of shards.count's tally check). Memory moves
// between two levels with both their locks held (a slab carved from an
// arena chunk, a wholly free slab given back, a segment's chunk added or
// dropped), or, from the depot down, with the depot's lock held from
// before it leaves one level until it is in the other; a block handed out
// is counted in use (the shards' tallies) under the lock of the level it
// comes from. Stats and Close take every level's lock, the depot's first,
// so they never see a byte in neither level or in both.

// depot is the pool's cache of free small blocks per size class, between
// the shards and the arena (Go's mcentral): shards refill from it and
// spill to it; it carves new slabs from arena chunks and gives wholly free
// slabs back. It also keeps the blocks freed behind fences that have not
// completed (pending), of every size, until their fences complete.
//
// Its lock, mu, guards lists, pending and the counters below. It comes
// first among the levels' locks: a path that holds it may take the
// arena's, the holes', the segments' and the shards' locks, never the
// other way round.
type depot struct {
	mu      sync.Mutex
	lists   [numClasses]freeList
	pending []*block
	slabs   uint64 // slabs carved
	reuse   uint64 // pending blocks reused at once on their own stream
	frees   uint64 // large and huge blocks freed behind fences

	// npend is len(pending) and live the slabs carved and not given back,
	// written under mu and read without it: a large Alloc sweeps only when
	// blocks are pending, and compacts only when slabs are out.
	npend, live atomic.Int64

	p      *Pool // the blocks' pool, its options and closed flag
	shards *shards
	arena  *arena
}

// alloc is the small path below the shards: a block of class c from the
// depot, which refills the caller's shard on the way; when the depot has
// none, a new slab carved from an arena chunk, the arena grown first when
// it has no room (no lock held while it grows) or the chunk's decommitted
// granules committed again (holes.recommit).
func (d *depot) alloc(ctx context.Context, c int, n uint64, s memapi.Stream) (Block, error) {
	var committed *chunk
	for {
		h, busy, miss, err := d.take(c, n, s, committed)
		committed = nil
		switch {
		case err != nil || h.b != nil:
			return h, err
		case busy != nil:
			if err := d.arena.holes.recommit(ctx, n, busy); err != nil {
				return Block{}, err
			}
			committed = busy
		default:
			if err := d.arena.grow(ctx, n, miss); err != nil {
				return Block{}, err
			}
		}
	}
}

// take takes a block of class c under the depot's lock: from the pending
// list (its own stream), the depot (refilling the caller's shard), the
// other shards' free blocks of the class (steal), or a new slab carved from
// an arena chunk (committed: one whose granules were just committed
// again). When the arena has no room it says how it must grow (miss);
// when the new slab's chunk covers decommitted granules it returns the
// chunk, busy, to be committed outside every lock.
func (d *depot) take(c int, n uint64, s memapi.Stream, committed *chunk) (h Block, busy *chunk, miss growth, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.p.closed.Load() {
		return Block{}, nil, miss, errClosed()
	}
	if committed != nil {
		if err := d.arena.taken(committed); err != nil {
			return Block{}, nil, miss, err
		}
		d.carve(c, committed)
	}
	d.sweepLocked()
	if b := d.takePending(c, s); b != nil {
		d.shards.countAlloc()
		d.shards.count(b.size, n)
		return b.open(n, s), nil, miss, nil
	}
	if d.lists[c].n == 0 && !d.steal(c) {
		size := classSize[c] * uint64(slabCount(c, uint64(d.p.opts.SlabBytes)))
		var ch *chunk
		var isBusy bool
		ch, isBusy, miss = d.arena.takeSlab(size)
		if ch == nil && d.live.Load() > 0 {
			// Before the arena grows, wholly free slabs go back to it,
			// where any class or a large block can use them.
			d.compactLocked()
			ch, isBusy, miss = d.arena.takeSlab(size)
		}
		switch {
		case ch == nil:
			return Block{}, nil, miss, nil
		case isBusy:
			return Block{}, ch, miss, nil
		}
		d.carve(c, ch)
	}
	b := d.lists[c].pop()
	d.refill(c)
	d.shards.count(b.size, n)
	return b.open(n, s), nil, miss, nil
}

// refill moves about half a shard's bound of class c from the depot to
// the caller's shard and counts the caller's alloc there. The caller
// holds mu.
func (d *depot) refill(c int) {
	sh := d.shards.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for i := 0; i < (shardMax(c)+1)/2 && d.lists[c].n > 0; i++ {
		sh.lists[c].push(d.lists[c].pop())
	}
	sh.allocs++
}

// spill moves half of a full shard list of class c to the depot.
func (d *depot) spill(sh *shard, c int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := &sh.lists[c]
	for l.n > (shardMax(c)+1)/2 {
		d.put(l.pop())
	}
}

// steal moves the free blocks of class c that the shards keep to the
// depot, before a new slab is carved: a shard whose P stopped calling (or
// that a goroutine left for another P) would otherwise strand them until
// the pool next compacts, and the new slab would add to the peak. The
// caller holds mu.
func (d *depot) steal(c int) bool {
	for i := range d.shards.s {
		d.pull(&d.shards.s[i], c)
	}
	return d.lists[c].n > 0
}

// pull moves the shard's free blocks of class c (every class when c < 0)
// to the depot. The caller holds mu.
func (d *depot) pull(sh *shard, c int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	lo, hi := c, c+1
	if c < 0 {
		lo, hi = 0, numClasses
	}
	for k := lo; k < hi; k++ {
		for b := sh.lists[k].pop(); b != nil; b = sh.lists[k].pop() {
			d.put(b)
		}
	}
}

// compact sweeps the pending blocks, gathers the shards' free blocks into
// the depot and gives the slabs that are then wholly free back to the
// arena (Reclaim, Trim, a large Alloc before the arena grows). It reports
// false when the pool is closed.
func (d *depot) compact() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.p.closed.Load() {
		return false
	}
	d.sweepLocked()
	d.compactLocked()
	return true
}

// compactLocked gathers the shards' free blocks into the depot and gives
// the slabs that are then wholly free back to the arena: run before the
// pool grows, so free slabs of one class never make it hold a segment
// more for another. The caller holds mu.
func (d *depot) compactLocked() {
	for i := range d.shards.s {
		d.pull(&d.shards.s[i], -1)
	}
	a := d.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ch := range d.wholeSlabs() {
		a.give(ch)
		d.live.Add(-1)
	}
}

// put puts a free small block in the depot.
func (d *depot) put(b *block) { d.lists[b.slab.class].push(b) }

// carve carves the chunk ch, taken from the arena and committed, into a
// slab of class c in the depot. The caller holds mu.
func (d *depot) carve(c int, ch *chunk) {
	k := slabCount(c, uint64(d.p.opts.SlabBytes))
	sz := classSize[c]
	sl := &slab{ch: ch, class: c, slots: make([]block, k)}
	ch.slab = sl
	for i := k - 1; i >= 0; i-- {
		b := &sl.slots[i]
		b.p, b.addr, b.size, b.slab = d.p, ch.addr+uint64(i)*sz, sz, sl // its zero word: free, Open in generation 0 (block.open)
		d.lists[c].push(b)
	}
	d.slabs++
	d.live.Add(1)
}

// wholeSlabs takes out of the depot the blocks of every slab whose every
// block is in it, and returns those slabs' chunks (to be given back to the
// arena). The caller holds mu.
func (d *depot) wholeSlabs() []*chunk {
	count := map[*slab]int{}
	for c := range d.lists {
		for b := d.lists[c].head; b != nil; b = b.next {
			count[b.slab]++
		}
	}
	for c := range d.lists {
		var keep freeList
		var rev []*block
		for b := d.lists[c].pop(); b != nil; b = d.lists[c].pop() {
			if count[b.slab] != len(b.slab.slots) {
				rev = append(rev, b)
			}
		}
		for i := len(rev) - 1; i >= 0; i-- {
			keep.push(rev[i])
		}
		d.lists[c] = keep
	}
	var out []*chunk
	for sl, n := range count {
		if n == len(sl.slots) {
			out = append(out, sl.ch)
		}
	}
	return out
}

// freePending puts a block freed behind unfinished fences on the pending
// list.
func (d *depot) freePending(b *block) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.shards.uncount(b)
	d.pending = append(d.pending, b)
	d.npend.Store(int64(len(d.pending)))
	if b.slab == nil {
		d.frees++
	} else {
		d.shards.countFree()
	}
}

// takePending takes a pending small block of class c whose fences were all
// recorded on stream s (reusable at once on s), or nil. The caller holds
// mu.
func (d *depot) takePending(c int, s memapi.Stream) *block {
	if s == nil {
		return nil
	}
	for i, b := range d.pending {
		if b.slab != nil && b.slab.class == c && !b.foreign && b.stream == s {
			d.pending = append(d.pending[:i], d.pending[i+1:]...)
			d.npend.Store(int64(len(d.pending)))
			b.reset()
			d.reuse++
			return b
		}
	}
	return nil
}

// sweep moves the pending blocks whose fences all completed down to the
// cache, under mu.
func (d *depot) sweep() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepLocked()
}

// sweepLocked moves pending blocks whose fences all completed to the
// cache: a small block to the depot, a large one to the arena or the free
// huge segments (under that level's lock, taken per block). Fences are the
// caller's code (Done may panic): the list is consistent after every
// block, so a panic loses or duplicates nothing. The caller holds mu and
// no other level's lock.
func (d *depot) sweepLocked() {
	for i := 0; i < len(d.pending); {
		b := d.pending[i]
		if !b.done() {
			i++
			continue
		}
		last := len(d.pending) - 1
		d.pending[i] = d.pending[last]
		d.pending[last] = nil
		d.pending = d.pending[:last]
		d.npend.Store(int64(last))
		gen, _ := b.unpack()
		st := ep.Released
		if b.slab != nil {
			st = ep.Open // free, in the generation it is handed out in next (block.open)
		}
		b.word.Store(pack(gen, st))
		b.reset()
		switch {
		case b.slab != nil:
			d.put(b)
		case b.ch.seg.huge:
			d.arena.segs.giveHugeLocking(b.ch)
		default:
			d.arena.giveLocking(b.ch)
		}
	}
}

// cachedBytes is the bytes of the free small blocks in the depot and of
// the pending blocks (of which pending). The caller holds mu.
func (d *depot) cachedBytes() (cached, pending uint64) {
	for c := range d.lists {
		cached += uint64(d.lists[c].n) * classSize[c]
	}
	for _, b := range d.pending {
		pending += b.size
	}
	return cached + pending, pending
}

// closeLocked empties the depot at Close and returns the fences of the
// pending blocks by segment (the segments' release waits for them). The
// caller holds every lock.
func (d *depot) closeLocked() map[*segment][]memapi.Fence {
	fences := map[*segment][]memapi.Fence{}
	for _, b := range d.pending {
		seg := b.segment()
		fences[seg] = append(fences[seg], b.fences...)
	}
	d.pending, d.lists = nil, [numClasses]freeList{}
	d.npend.Store(0)
	d.live.Store(0)
	return fences
}
