package pool

import (
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// The pool's slow path is four levels, each a type with its own lock, in
// the manner of Go's runtime (mcache → mcentral → mheap):
//
//	shard     the caller's P's cache of free small blocks (shard.go): the fast path
//	depot     free small blocks per size class, and blocks pending behind fences
//	arena     the best-fit index of the free chunks of every segment (arena.go)
//	holes     the region's decommitted granules (holes.go)
//	segments  the backing: segments, huge segments, the region, what was given back (segments.go)
//
// Lock order: the pool's growMu (the region's transactions, held across pmm
// calls, never under a level's lock) → depot.mu → arena.mu → holes.mu →
// segments.mu → the shards' locks (in index order). A path takes only the
// levels it touches, in that order, each unlocked by defer. Memory moves
// between two levels with both their locks held (a slab carved from an
// arena chunk, a wholly free slab given back, a segment's chunk added or
// dropped), or, from the depot down, with the depot's lock held from
// before it leaves one level until it is in the other; Stats and Close
// take every level's lock, the depot's first, so they never see a byte in
// neither level or in both.

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
}

// put puts a free small block in the depot.
func (d *depot) put(b *block) { d.lists[b.slab.class].push(b) }

// takePending takes a pending small block of class c whose fences were all
// recorded on stream s (reusable at once on s), or nil.
func (d *depot) takePending(c int, s memapi.Stream) *block {
	if s == nil {
		return nil
	}
	for i, b := range d.pending {
		if b.slab != nil && b.slab.class == c && !b.foreign && b.stream == s {
			d.pending = append(d.pending[:i], d.pending[i+1:]...)
			b.reset()
			d.reuse++
			return b
		}
	}
	return nil
}

// cachedBytes is the bytes of the free small blocks in the depot and of
// the pending blocks (of which pending).
func (d *depot) cachedBytes() (cached, pending uint64) {
	for c := range d.lists {
		cached += uint64(d.lists[c].n) * classSize[c]
	}
	for _, b := range d.pending {
		pending += b.size
	}
	return cached + pending, pending
}

// carve carves the chunk ch, taken from the arena and committed, into a
// slab of class c of the pool p in the depot. The caller holds mu.
func (d *depot) carve(p *Pool, c int, ch *chunk) {
	k := slabCount(c, uint64(p.opts.SlabBytes))
	sz := classSize[c]
	sl := &slab{ch: ch, class: c, slots: make([]block, k)}
	ch.slab = sl
	for i := k - 1; i >= 0; i-- {
		b := &sl.slots[i]
		b.p, b.addr, b.size, b.slab = p, ch.addr+uint64(i)*sz, sz, sl
		b.word.Store(pack(0, ep.Released))
		d.lists[c].push(b)
	}
	d.slabs++
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
