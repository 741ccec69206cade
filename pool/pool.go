package pool

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// Backing says how a pool obtains its memory.
type Backing string

const (
	// BackingSegments is whole pmm Buffers (Binding.Allocate), each freed
	// whole once every block in it is free.
	BackingSegments Backing = "segments"
)

// MaxAlloc is the largest request a pool accepts; larger ones are
// memapi.ErrInvalidSize (no device has that much).
const MaxAlloc = 1 << 46

// Options configure a pool. Zero values take the defaults.
type Options struct {
	// SegmentBytes is the least a new segment holds (default 2 MiB, the
	// caching allocator's small segment; 8 and 32 MiB fragmented more on
	// the random pattern); a larger request gets a segment of its own size.
	SegmentBytes memapi.Bytes
	// SlabBytes is about what one slab of a size class holds (default
	// 2 MiB).
	SlabBytes memapi.Bytes
	// Wait bounds how long a growth waits for other holders' refunds
	// after asking them (default 1 s); the caller's ctx may end it sooner.
	Wait time.Duration
	// Backing chooses the backing; empty: BackingRegion when the binding's
	// mechanism offers VirtualBacking, else BackingSegments. Stats.Backing
	// says which. BackingRegion without VirtualBacking, or any other value,
	// is memapi.ErrUnsupported.
	Backing Backing
	// RegionBytes is the address range a BackingRegion pool reserves
	// (default 16 GiB): the most it can ever hold.
	RegionBytes memapi.Bytes
	// HugeBytes is the least request that gets a segment of its own,
	// never split, whatever the backing (default 8 MiB; huge.go).
	HugeBytes memapi.Bytes
	// HoleSlack (BackingRegion), when above 0, is the share of what the
	// pool holds that may be whole free granules still committed when the
	// pool's committed bytes are about to rise (a growth, a recommit);
	// above it they are decommitted first (holes.go), and a block placed
	// on them later commits them again. 1/20 gives peak held / peak
	// requested 1.14 on the random pattern at 64 KiB granules instead of
	// 1.25, at about 20 times the pool's time there: on the CPU a recommit
	// pays the kernel's zeroing of the pages again. The default, 0, never
	// decommits before a rise; Reclaim and Trim decommit the holes either
	// way, so the cache they hold answers pressure.
	HoleSlack float64
}

// Pool is a caching sub-allocator over one pmm Binding. It is a governor
// Holder (Reclaim): register it with HolderOptions.Cache so that pressure
// asks it before holders that would evict data.
//
// Its fast path is the caller's shard (shard.go); its slow path is the
// levels depot, arena, holes and segments, each with its own lock, taken
// in that order (depot.go).
type Pool struct {
	bind *pmm.Binding
	opts Options

	shards []shard
	mask   uint32
	closed atomic.Bool

	// The bytes in use and requested are the shards' tallies (tally.go);
	// their peaks, and the count of syncs that raised them, are guarded
	// by every shard's lock.
	peakUse, peakReq int64
	syncs            uint64

	growMu sync.Mutex // serializes a region's pmm calls (Grow, Shrink, Commit, Decommit); before every level's lock

	depot depot
	arena arena
	holes holes
	segs  segments

	// largeAllocs and largeFrees count the large and huge blocks handed
	// out and freed; each is added to under the lock of the level the
	// block comes from or goes to (depot, arena or segments), so Stats,
	// holding every level's lock, reads them exact.
	largeAllocs, largeFrees atomic.Uint64
}

// New returns a pool over b. It holds nothing until the first Alloc.
func New(b *pmm.Binding, opts Options) (*Pool, error) {
	caps, err := b.Capabilities()
	if err != nil {
		return nil, err
	}
	vb := caps.Has(memapi.CapVirtualBacking)
	switch {
	case opts.Backing == "" && vb:
		opts.Backing = BackingRegion
	case opts.Backing == "":
		opts.Backing = BackingSegments
	case opts.Backing == BackingRegion && !vb:
		return nil, &memapi.Error{Op: "pool.New", Kind: memapi.ErrUnsupported, Detail: "BackingRegion needs VirtualBacking, which the mechanism lacks"}
	case opts.Backing != BackingRegion && opts.Backing != BackingSegments:
		return nil, &memapi.Error{Op: "pool.New", Kind: memapi.ErrUnsupported, Detail: "unknown backing " + string(opts.Backing)}
	}
	if opts.RegionBytes == 0 {
		opts.RegionBytes = 16 << 30
	}
	if opts.SegmentBytes == 0 {
		opts.SegmentBytes = 2 << 20
	}
	if opts.Wait == 0 {
		opts.Wait = time.Second
	}
	if opts.SlabBytes == 0 {
		opts.SlabBytes = 2 << 20
	}
	if opts.HugeBytes == 0 {
		opts.HugeBytes = 8 << 20
	}
	n := 1 // a shard per P (pick), for every P the machine can run at once
	for n < max(runtime.GOMAXPROCS(0), runtime.NumCPU()) && n < 64 {
		n *= 2
	}
	p := &Pool{bind: b, opts: opts, shards: make([]shard, n), mask: uint32(n - 1)}
	p.segs.all = map[*segment]struct{}{}
	return p, nil
}

// Binding returns the pool's binding.
func (p *Pool) Binding() *pmm.Binding { return p.bind }

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
		switch h, res, err := p.allocShard(c, n, s); res {
		case shardServed:
			return h, err
		case shardSync:
			if h, ok, err := p.allocSynced(c, n, s); ok {
				return h, err
			}
		}
		return p.allocSmallSlow(ctx, c, n, s)
	}
	return p.allocLarge(ctx, n, s)
}

// What the fast path did.
const (
	shardServed = iota // a block, or the pool's error
	shardEmpty         // the shard has no block of the class
	shardSync          // it has one, but counting it needs a sync (tally.go)
)

// allocShard is the fast path: a block of class c from the caller's shard,
// with no pool-wide lock and no write outside the shard. Every locked
// section of the pool unlocks by defer, so that a panic (a caller's fence,
// a runtime error) never leaves a lock held.
func (p *Pool) allocShard(c int, n uint64, s memapi.Stream) (h Block, res int, err error) {
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p.closed.Load() {
		return Block{}, shardServed, errClosed()
	}
	l := &sh.lists[c]
	if l.head == nil {
		return Block{}, shardEmpty, nil
	}
	if !sh.t.fits(classSize[c], n) {
		return Block{}, shardSync, nil
	}
	b := l.pop()
	sh.t.add(b.size, n)
	sh.allocs++
	return b.open(n, s), shardServed, nil
}

// allocSynced is the fast path when the block would pass the shard's caps:
// the same, under every shard's lock, counted through a sync. ok is false
// when the shard's list emptied meanwhile.
func (p *Pool) allocSynced(c int, n uint64, s memapi.Stream) (h Block, ok bool, err error) {
	p.lockShards()
	defer p.unlockShards()
	if p.closed.Load() {
		return Block{}, true, errClosed()
	}
	sh := p.syncShard()
	b := sh.lists[c].pop()
	if b == nil {
		return Block{}, false, nil
	}
	p.syncLocked(sh, b.size, n)
	sh.allocs++
	return b.open(n, s), true, nil
}

func errClosed() error { return &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrClosed} }

// hand counts b in use and opens it, for a block taken under a level's
// lock (the caller holds no shard's lock).
func (p *Pool) hand(b *block, n uint64, s memapi.Stream) Block {
	p.count(b, n)
	return b.open(n, s)
}

func (p *Pool) allocSmallSlow(ctx context.Context, c int, n uint64, s memapi.Stream) (Block, error) {
	for {
		h, grow, pend, err := p.takeSmall(c, n, s)
		if pend != nil {
			// The new slab's chunk covers decommitted granules.
			if err := p.recommit(ctx, n, pend); err != nil {
				return Block{}, err
			}
			if err := p.carveCommitted(c, pend); err != nil {
				return Block{}, err
			}
			continue
		}
		if grow == 0 {
			return h, err
		}
		if err := p.grow(ctx, n, grow); err != nil {
			return Block{}, err
		}
	}
}

// takeSmall takes a block of class c under the depot's lock: from the
// pending list (its own stream), the depot (refilling the caller's shard),
// or a new slab carved from an arena chunk. When the arena has no room it
// reports the bytes to grow by instead; when the new slab's chunk covers
// decommitted granules it returns the chunk, busy, to be committed outside
// every lock (pend).
func (p *Pool) takeSmall(c int, n uint64, s memapi.Stream) (h Block, grow uint64, pend *chunk, err error) {
	d := &p.depot
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed.Load() {
		return Block{}, 0, nil, errClosed()
	}
	p.sweep()
	if b := d.takePending(c, s); b != nil {
		p.countSmallAlloc()
		return p.hand(b, n, s), 0, nil, nil
	}
	if d.lists[c].n == 0 && !p.steal(c) {
		size := classSize[c] * uint64(slabCount(c, uint64(p.opts.SlabBytes)))
		ch, busy := p.slabChunk(size)
		if ch == nil {
			return Block{}, size, nil, nil
		}
		if busy {
			return Block{}, 0, ch, nil
		}
		d.carve(p, c, ch)
	}
	b := d.lists[c].pop()
	p.refill(c)
	return p.hand(b, n, s), 0, nil, nil
}

// slabChunk takes a chunk of size bytes from the arena for a slab,
// compacting first when none fits; nil when even that finds none. A chunk
// that covers decommitted granules comes back busy. The caller holds the
// depot's lock.
func (p *Pool) slabChunk(size uint64) (ch *chunk, busy bool) {
	a := &p.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	take := func() bool { ch = p.arena.take(&p.holes, size); return ch != nil }
	if !take() && !p.compact(take) {
		return nil, false
	}
	if p.holes.coversLocking(ch) {
		a.markBusy(ch)
		return ch, true
	}
	return ch, false
}

// refill moves about half a shard's bound of class c from the depot to
// the caller's shard and counts the caller's alloc there. The caller
// holds the depot's lock.
func (p *Pool) refill(c int) {
	d := &p.depot
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for i := 0; i < (shardMax(c)+1)/2 && d.lists[c].n > 0; i++ {
		sh.lists[c].push(d.lists[c].pop())
	}
	sh.allocs++
}

// steal moves the free blocks of class c that other shards keep to the
// depot, before a new slab is carved: a shard whose P stopped calling (or
// that a goroutine left for another P) would otherwise strand them until
// the pool next compacts, and the new slab would add to the peak. The
// caller holds the depot's lock.
func (p *Pool) steal(c int) bool {
	for i := range p.shards {
		p.stealShard(&p.shards[i], c)
	}
	return p.depot.lists[c].n > 0
}

func (p *Pool) stealShard(sh *shard, c int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for b := sh.lists[c].pop(); b != nil; b = sh.lists[c].pop() {
		p.depot.put(b)
	}
}

func (p *Pool) countSmallAlloc() {
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.allocs++
}

// compact gathers the shards' free blocks into the depot and gives the
// slabs that are then wholly free back to the arena, where any class or a
// large block can use them; then it retries try. It runs before the pool
// grows, so free slabs of one class never make it hold a segment more for
// another. The caller holds the depot's and the arena's locks.
func (p *Pool) compact(try func() bool) bool {
	p.flushShards()
	p.freeSlabs()
	return try()
}

// carveCommitted carves a slab of class c from a busy chunk whose granules
// were committed again (recommit).
func (p *Pool) carveCommitted(c int, ch *chunk) error {
	d := &p.depot
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := p.takenLocking(ch); err != nil {
		return err
	}
	d.carve(p, c, ch)
	return nil
}

func (p *Pool) allocLarge(ctx context.Context, n uint64, s memapi.Stream) (Block, error) {
	r := roundLarge(n)
	if r >= uint64(p.opts.HugeBytes) {
		for {
			h, ok, err := p.takeHuge(r, n, s)
			if ok || err != nil {
				return h, err
			}
			if err := p.growHuge(ctx, n, r); err != nil {
				return Block{}, err
			}
		}
	}
	for {
		h, pend, err := p.takeLarge(r, n, s)
		if pend != nil {
			// The chunk covers decommitted granules.
			if err := p.recommit(ctx, n, pend); err != nil {
				return Block{}, err
			}
			return p.largeCommitted(pend, r, n, s)
		}
		if h.b != nil || err != nil {
			return h, err
		}
		if err := p.grow(ctx, n, r); err != nil {
			return Block{}, err
		}
	}
}

// takeLarge takes a best-fit chunk of r bytes from the arena, under the
// depot's lock (it sweeps the pending blocks and may compact) and the
// arena's; a zero Block and no error when the arena has none even after
// compaction. A chunk that covers decommitted granules is returned busy
// instead (pend), to be committed outside every lock.
func (p *Pool) takeLarge(r, n uint64, s memapi.Stream) (h Block, pend *chunk, err error) {
	d := &p.depot
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.closed.Load() {
		return Block{}, nil, errClosed()
	}
	p.sweep()
	a := &p.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := p.arena.take(&p.holes, r)
	if ch == nil {
		p.compact(func() bool { ch = p.arena.take(&p.holes, r); return ch != nil })
	}
	if ch == nil {
		return Block{}, nil, nil
	}
	if p.holes.coversLocking(ch) {
		a.markBusy(ch)
		return Block{}, ch, nil
	}
	return p.largeBlock(ch, r, n, s), nil, nil
}

// largeCommitted hands out a busy chunk whose granules were committed
// again (recommit) as a large block.
func (p *Pool) largeCommitted(ch *chunk, r, n uint64, s memapi.Stream) (Block, error) {
	a := &p.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := p.taken(ch); err != nil {
		return Block{}, err
	}
	return p.largeBlock(ch, r, n, s), nil
}

// largeBlock hands out the chunk ch as a large block; the caller holds the
// lock of the level ch came from (the arena's).
func (p *Pool) largeBlock(ch *chunk, r, n uint64, s memapi.Stream) Block {
	b := &block{p: p, addr: ch.addr, size: r, ch: ch}
	b.word.Store(pack(0, ep.Released))
	ch.blk = b
	p.largeAllocs.Add(1)
	return p.hand(b, n, s)
}

// grow adds a segment of at least need bytes. It holds no pool lock while
// the binding allocates: the governor may ask this very pool to Reclaim.
func (p *Pool) grow(ctx context.Context, wanted, need uint64) error {
	if p.opts.Backing == BackingRegion {
		return p.regionGrow(ctx, wanted, need)
	}
	return p.growSegment(ctx, wanted, need, false)
}

// growSegment adds a segment (a pmm Buffer) of at least need bytes, at
// least SegmentBytes unless it is huge.
func (p *Pool) growSegment(ctx context.Context, wanted, need uint64, huge bool) error {
	size := need
	if !huge {
		size = max(need, uint64(p.opts.SegmentBytes))
	}
	trimmed0 := p.segs.reclaimedNow()
	wctx, cancel := context.WithTimeout(ctx, p.opts.Wait)
	buf, err := p.bind.Allocate(wctx, memapi.Bytes(size))
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		return p.growFailed(wanted, size, err, waited, trimmed0)
	}
	seg := &segment{buf: buf, base: uint64(buf.Addr()), size: uint64(buf.Size()), huge: huge}
	a, g := &p.arena, &p.segs
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.closed.Load() {
		return errors.Join(errClosed(), g.closeKept(buf))
	}
	g.all[seg] = struct{}{}
	g.add(seg.size)
	g.allocs++
	if huge {
		seg.head = &chunk{seg: seg, addr: seg.base, size: seg.size}
		g.giveHuge(seg.head)
	} else {
		a.add(seg)
	}
	return nil
}

// growFailed counts a failed growth and gives its error: over budget, an
// *OverBudgetError with the pool's figures beside the governor's error. A growth that ran past Options.Wait (the governor's wait, or
// the mechanism call after it, which sees the same context) is over budget
// too: the bytes were not there in time. trimmed0 is the pool's reclaimed
// bytes when the growth started (segments.reclaimedNow).
func (p *Pool) growFailed(wanted, size uint64, err error, waited bool, trimmed0 uint64) error {
	g := &p.segs
	g.mu.Lock()
	defer g.mu.Unlock()
	g.growFails++
	if !errors.Is(err, memapi.ErrOverBudget) && !(waited && errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	g.overBudget++
	p.lockShards()
	use, _ := p.totalsLocked()
	p.unlockShards()
	inUse := uint64(use)
	auth, _ := p.bind.Authority()
	return &OverBudgetError{Authority: auth, Request: memapi.Bytes(wanted), Segment: memapi.Bytes(size), Held: memapi.Bytes(g.held),
		InUse: memapi.Bytes(inUse), Cached: memapi.Bytes(g.held - inUse), Trimmed: memapi.Bytes(g.reclaimed - trimmed0), Err: err}
}

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
	if !b.claim(h.gen) {
		return &memapi.Error{Op: "pool.Free", Kind: ErrDoubleFree, Wanted: memapi.Bytes(b.size)}
	}
	// This Free owns the block now: no other Free, stale handle or
	// RecordUse of this generation reads or writes its fields.
	pendingNow := len(b.fences) > 0 && !b.done()
	st := ep.Released
	if pendingNow {
		st = ep.Pending
	}
	b.word.Store(pack(h.gen+1, st))
	if pendingNow {
		p.freePending(b)
		return nil
	}
	b.reset()
	if b.slab != nil {
		if sh := p.freeToShard(b); sh != nil {
			p.spill(sh, b.slab.class)
		}
		return nil
	}
	p.freeLarge(b)
	return nil
}

// freeLarge gives a large block's chunk back: to the arena, coalesced, or
// to the free huge segments, under that level's lock.
func (p *Pool) freeLarge(b *block) {
	if b.ch.seg.huge {
		g := &p.segs
		g.mu.Lock()
		defer g.mu.Unlock()
		p.uncount(b)
		p.largeFrees.Add(1)
		g.giveHuge(b.ch)
		return
	}
	a := &p.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	p.uncount(b)
	p.largeFrees.Add(1)
	a.give(b.ch)
}

// freePending puts a block freed behind unfinished fences on the pending
// list.
func (p *Pool) freePending(b *block) {
	d := &p.depot
	d.mu.Lock()
	defer d.mu.Unlock()
	p.uncount(b)
	d.pending = append(d.pending, b)
	if b.slab == nil {
		p.largeFrees.Add(1)
	} else {
		p.countSmallFree()
	}
}

// freeToShard pushes a free small block on the caller's shard; it returns
// the shard when that is now over its bound (the caller spills it).
func (p *Pool) freeToShard(b *block) *shard {
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.t.sub(b.size, b.req)
	sh.frees++
	l := &sh.lists[b.slab.class]
	l.push(b)
	if l.n <= shardMax(b.slab.class) {
		return nil
	}
	return sh
}

// spill moves half of a full shard list of class c to the depot.
func (p *Pool) spill(sh *shard, c int) {
	d := &p.depot
	d.mu.Lock()
	defer d.mu.Unlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := &sh.lists[c]
	for l.n > (shardMax(c)+1)/2 {
		d.put(l.pop())
	}
}

func (p *Pool) countSmallFree() {
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.frees++
}

// sweep moves pending blocks whose fences all completed to the cache: a
// small block to the depot, a large one to the arena or the free huge
// segments (under that level's lock, taken per block). Fences are the
// caller's code (Done may panic): the list is consistent after every
// block, so a panic loses or duplicates nothing. The caller holds the
// depot's lock and no other level's.
func (p *Pool) sweep() {
	d := &p.depot
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
		gen, _ := b.unpack()
		b.word.Store(pack(gen, ep.Released))
		b.reset()
		if b.slab != nil {
			d.put(b)
		} else {
			p.giveChunk(b.ch)
		}
	}
}

// giveChunk gives a large block's chunk back, under the lock of the level
// it goes to; the caller holds the depot's lock at most.
func (p *Pool) giveChunk(ch *chunk) {
	if ch.seg.huge {
		p.segs.mu.Lock()
		defer p.segs.mu.Unlock()
		p.segs.giveHuge(ch)
		return
	}
	p.arena.mu.Lock()
	defer p.arena.mu.Unlock()
	p.arena.give(ch)
}

// Close releases every segment, behind the fences of pending blocks. It
// fails with memapi.ErrInUse, changing nothing, while blocks are in use.
// It is idempotent.
func (p *Pool) Close() error {
	err, closed := p.closeAll()
	if closed {
		// Closed before: retry the releases that failed.
		return p.retryReleases(context.Background())
	}
	return err
}

// lockLevels takes every level's lock, in order (depot.go), and every
// shard's; unlockLevels lets them go.
func (p *Pool) lockLevels() {
	p.depot.mu.Lock()
	p.arena.mu.Lock()
	p.holes.mu.Lock()
	p.segs.mu.Lock()
	p.lockShards()
}

func (p *Pool) unlockLevels() {
	p.unlockShards()
	p.segs.mu.Unlock()
	p.holes.mu.Unlock()
	p.arena.mu.Unlock()
	p.depot.mu.Unlock()
}

// lockRegionLevels takes the arena's, the holes' and the segments' locks,
// in order (depot.go): the region's paths that cut or fill its tail and
// holes change all three. unlockRegionLevels lets them go.
func (p *Pool) lockRegionLevels() {
	p.arena.mu.Lock()
	p.holes.mu.Lock()
	p.segs.mu.Lock()
}

func (p *Pool) unlockRegionLevels() {
	p.segs.mu.Unlock()
	p.holes.mu.Unlock()
	p.arena.mu.Unlock()
}

func (p *Pool) closeAll() (err error, wasClosed bool) {
	p.lockLevels()
	defer p.unlockLevels()
	if p.closed.Load() {
		return nil, true
	}
	p.closed.Store(true)
	inUse, _ := p.totalsLocked()
	if inUse != 0 {
		p.closed.Store(false)
		return &memapi.Error{Op: "pool.Close", Kind: memapi.ErrInUse, Wanted: memapi.Bytes(inUse), Detail: "blocks still in use"}, false
	}
	d, g := &p.depot, &p.segs
	fences := map[*segment][]memapi.Fence{}
	for _, b := range d.pending {
		seg := b.segment()
		fences[seg] = append(fences[seg], b.fences...)
	}
	var errs []error
	if g.rseg != nil {
		g.all[g.rseg] = struct{}{}
	}
	for seg := range g.all {
		for _, f := range fences[seg] {
			errs = append(errs, seg.owned().RecordUse(f))
		}
		errs = append(errs, g.closeKept(seg.owned()))
		g.frees++
	}
	// g.region stays: its release may fail and be retried (release.go).
	g.rseg = nil
	clear(g.all)
	g.held, d.pending, p.arena.free, g.huge = 0, nil, nil, nil
	p.holes.set, p.arena.busy = holeSet{}, 0
	d.lists = [numClasses]freeList{}
	for i := range p.shards {
		p.shards[i].lists = [numClasses]freeList{}
	}
	return errors.Join(errs...), false
}

func (b *block) segment() *segment {
	if b.slab != nil {
		return b.slab.ch.seg
	}
	return b.ch.seg
}
