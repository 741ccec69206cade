package pool

import (
	"context"
	"sync"
	"sync/atomic"
	_ "unsafe" // go:linkname

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// The fast path, top to bottom: a small Alloc or Free locks the caller's
// shard and nothing else. A shard that has no block of the class asks the
// depot (depot.go), which refills it; one that holds too many spills half
// to the depot. Larger requests go to the arena (arena.go) or, from
// Options.HugeBytes, to the segments (huge.go).

// Alloc returns a block of at least size bytes for use on stream s (nil: no
// stream), aligned to Alignment. Requests up to SmallMax come from the
// size-class slabs through a shard (no pool-wide lock when the shard has a
// block); larger ones are best-fit chunks. When the pool must grow and the
// governor is short, the pool's own cache is asked first (HolderOptions.
// Cache), then other holders; if that fails the error is a
// *OverBudgetError with the pool's figures, which wraps the governor's
// *governor.OverBudgetError. Zero and absurd sizes are memapi.ErrInvalidSize;
// after Close, memapi.ErrClosed.
func (p *Pool) Alloc(ctx context.Context, size memapi.Bytes, s memapi.Stream) (Block, error) {
	if size == 0 || size > MaxAlloc {
		return Block{}, invalidSize(size, "0 or larger than pool.MaxAlloc")
	}
	n := uint64(size)
	if n <= SmallMax {
		c := classOf(n)
		switch h, res, err := p.shards.pick().alloc(&p.closed, c, n, s); res {
		case shardServed:
			return h, err
		case shardSync:
			if h, ok, err := p.shards.allocSynced(&p.closed, c, n, s); ok {
				return h, err
			}
		}
		return p.depot.alloc(ctx, c, n, s)
	}
	if p.depot.npend.Load() != 0 {
		p.depot.sweep() // blocks whose fences completed go back down first
	}
	r := (n + Alignment - 1) &^ (Alignment - 1) // large blocks are rounded to Alignment
	if r >= uint64(p.opts.HugeBytes) {
		return p.segs.allocHuge(ctx, r, n, s)
	}
	return p.arena.alloc(ctx, r, n, s)
}

// What the fast path did.
const (
	shardServed = iota // a block, or the pool's error
	shardEmpty         // the shard has no block of the class
	shardSync          // it has one, but counting it needs a sync (tally.go)
)

// alloc is the fast path: a block of class c from the shard, with no
// pool-wide lock and no write outside the shard. Every locked section of
// the pool that runs more than arithmetic unlocks by defer, so that a
// panic (a caller's fence, a runtime error) never leaves a lock held.
func (sh *shard) alloc(closed *atomic.Bool, c int, n uint64, s memapi.Stream) (h Block, res int, err error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if closed.Load() {
		return Block{}, shardServed, errClosed()
	}
	l := &sh.lists[c]
	if l.head == nil {
		return Block{}, shardEmpty, nil
	}
	if !sh.t.tryAdd(classSize[c], n) {
		return Block{}, shardSync, nil
	}
	b := l.pop()
	sh.allocs++
	return b.open(n, s), shardServed, nil
}

func errClosed() error { return &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrClosed} }

// Free returns a block to the pool. Freed with fences that have not all
// completed, the block is pending: reusable at once on its own stream (if
// every fence was recorded with RecordUse), on others once they complete.
// A block freed twice is ErrDoubleFree; one from another pool, or a zero
// Block, ErrForeignBlock. Neither changes anything.
func (p *Pool) Free(h Block) error {
	b := h.b
	if b == nil || b.p != p {
		return &memapi.Error{Op: "pool.Free", Kind: ErrForeignBlock}
	}
	if b.slab != nil && b.word.CompareAndSwap(pack(h.gen, ep.Open), pack(h.gen+1, ep.Open)) {
		// The fast path: a small block with no fence recorded (not
		// fenced). The swap makes this Free its owner and leaves it free
		// in its next generation (block.open) in one step; no other Free,
		// stale handle or RecordUse of this generation gets past the word.
		b.stream = nil
		if sh := p.shards.pick(); sh.free(b) {
			p.depot.spill(sh, b.slab.class)
		}
		return nil
	}
	if !b.claim(h.gen) {
		return &memapi.Error{Op: "pool.Free", Kind: ErrDoubleFree, Wanted: memapi.Bytes(b.size)}
	}
	// This Free owns the block now: no other Free, stale handle or
	// RecordUse of this generation reads or writes its fields.
	pendingNow := len(b.fences) > 0 && !b.done()
	st := ep.Released
	switch {
	case pendingNow:
		st = ep.Pending
	case b.slab != nil:
		st = ep.Open // free, in the generation it is handed out in next (block.open)
	}
	b.word.Store(pack(h.gen+1, st))
	switch {
	case pendingNow:
		p.depot.freePending(b)
	case b.slab != nil:
		b.reset()
		if sh := p.shards.pick(); sh.free(b) {
			p.depot.spill(sh, b.slab.class)
		}
	case b.ch.seg.huge:
		b.reset()
		p.segs.freeHuge(b)
	default:
		b.reset()
		p.arena.freeLarge(b)
	}
	return nil
}

// free pushes a free small block on the shard; it reports whether the
// shard now holds more of the class than its bound (the caller spills).
func (sh *shard) free(b *block) bool {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.t.sub(b.size, b.req)
	sh.frees++
	l := &sh.lists[b.slab.class]
	l.push(b)
	return l.n > shardMax(b.slab.class)
}

// shard is one of the pool's caches of free small blocks. A small Alloc or
// Free locks one shard, the caller's P's (pick), and no pool-wide lock:
// goroutines running at once never meet on one. An empty shard refills
// from the pool's depot; a full one spills half its blocks there (Go's
// mcache and mcentral, mimalloc's pages). Its lock, mu, guards its lists,
// counts and tally; the shards' locks come after every level's (depot.go)
// and are taken together in index order only (shards.lockAll).
type shard struct {
	mu     sync.Mutex
	lists  [numClasses]freeList
	allocs uint64
	frees  uint64
	t      tally    // its share of the bytes in use and requested
	_      [64]byte // keeps shards on their own cache lines
}

// tally is one shard's share of the pool's figures, guarded by the
// shard's mutex (tally.go).
type tally struct {
	use, req       int64 // bytes in use (rounded) and requested
	useCap, reqCap int64 // the most use and req may reach without a sync
}

// tryAdd adds size bytes in use (n requested) when that stays under the
// shard's caps, and reports whether it did.
func (t *tally) tryAdd(size, n uint64) bool {
	if t.use+int64(size) > t.useCap || t.req+int64(n) > t.reqCap {
		return false
	}
	t.use += int64(size)
	t.req += int64(n)
	return true
}

func (t *tally) sub(size, n uint64) { t.use -= int64(size); t.req -= int64(n) }

// shardKeep is the bytes of one class a shard keeps before it spills half
// to the depot, and about what a refill moves: bounded in bytes, so that
// large classes are not stranded in idle shards.
const shardKeep = 256 << 10

// shardMax is how many blocks of class c a shard keeps (1 to 64).
func shardMax(c int) int { return int(min(64, max(1, shardKeep/classSize[c]))) }

// shards is the pool's shards, a power of two of them, and the peaks of
// the figures their tallies share (tally.go).
type shards struct {
	s    []shard
	mask uint32
	// The peaks of the bytes in use and requested, and the count of the
	// syncs that raised them, guarded by every shard's lock.
	peakUse, peakReq int64
	syncs            uint64
}

// pick returns the shard of the caller's P: a goroutine keeps meeting the
// same shard while it runs on the same P, so what it frees it allocates
// again from the same cache, and goroutines running at once on different
// Ps never share one. The P is only a hint: the goroutine may move to
// another P as soon as pick returns, which costs a colder cache, never
// correctness (every shard has its own lock). Two Ps share a shard only
// when GOMAXPROCS grows past the shards New made.
//
// The P's id comes from runtime.procPin (pinning and unpinning at once).
// It is an internal of the runtime that the runtime keeps linkable for the
// packages that use it (its declaration says so), and the cheapest per-P
// index a Go program has: the sync.Pool this pool used before pins twice
// per call (Get and Put), about 30 ns of a 50 ns Alloc+Free in
// BenchmarkSmallAllocFree.
func (ss *shards) pick() *shard {
	id := procPin()
	procUnpin()
	return &ss.s[uint32(id)&ss.mask]
}

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()
