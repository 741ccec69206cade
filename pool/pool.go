package pool

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

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
// It is the composition of its levels (depot.go says how they lock): the
// shards are the fast path (shard.go), each level below refills the one
// above it from the one below it, and only the last, the segments, calls
// pmm.
type Pool struct {
	bind   *pmm.Binding
	opts   Options
	closed atomic.Bool

	shards shards   // per-P caches of free small blocks, and the tallies (shard.go, tally.go)
	depot  depot    // free small blocks per size class, pending blocks (depot.go)
	arena  arena    // the free chunks, best fit (arena.go)
	holes  holes    // the region's decommitted granules (holes.go)
	segs   segments // the backing: Buffers, the region, huge segments (segments.go, region.go, huge.go)
}

// New returns a pool over b. It holds no bytes until the first Alloc; with
// BackingRegion it reserves the region's addresses (Options.RegionBytes,
// address space only: no budget) now, and fails, holding nothing, when
// that reservation fails.
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
	p := &Pool{bind: b, opts: opts}
	p.shards.s, p.shards.mask = make([]shard, n), uint32(n-1)
	p.depot.p, p.depot.shards, p.depot.arena = p, &p.shards, &p.arena
	p.arena.p, p.arena.depot, p.arena.holes, p.arena.segs, p.arena.shards = p, &p.depot, &p.holes, &p.segs, &p.shards
	p.holes.p, p.holes.arena, p.holes.segs, p.holes.slack = p, &p.arena, &p.segs, opts.HoleSlack
	p.segs.p, p.segs.shards, p.segs.all = p, &p.shards, map[*segment]struct{}{}
	if opts.Backing == BackingRegion {
		r, err := b.ReserveVirtual(context.Background(), opts.RegionBytes)
		if err != nil {
			return nil, err
		}
		p.segs.adopt(r)
		p.holes.base, p.holes.gran = p.segs.rseg.base, p.segs.gran
	}
	return p, nil
}

// Binding returns the pool's binding.
func (p *Pool) Binding() *pmm.Binding { return p.bind }

// Close releases every segment, behind the fences of pending blocks. It
// fails with memapi.ErrInUse, changing nothing, while blocks are in use.
// It is idempotent.
func (p *Pool) Close() error {
	err, closed := p.closeAll()
	if closed {
		// Closed before: retry the releases that failed.
		return p.segs.retry(context.Background())
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
	p.shards.lockAll()
}

func (p *Pool) unlockLevels() {
	p.shards.unlockAll()
	p.segs.mu.Unlock()
	p.holes.mu.Unlock()
	p.arena.mu.Unlock()
	p.depot.mu.Unlock()
}

func (p *Pool) closeAll() (err error, wasClosed bool) {
	p.lockLevels()
	defer p.unlockLevels()
	if p.closed.Load() {
		return nil, true
	}
	if inUse, _ := p.shards.totalsLocked(); inUse != 0 {
		return &memapi.Error{Op: "pool.Close", Kind: memapi.ErrInUse, Wanted: memapi.Bytes(inUse), Detail: "blocks still in use"}, false
	}
	p.closed.Store(true)
	fences := p.depot.closeLocked()
	p.arena.free, p.arena.busy = nil, 0
	p.holes.set = holeSet{}
	for i := range p.shards.s {
		p.shards.s[i].lists = [numClasses]freeList{}
	}
	return p.segs.closeLocked(fences), false
}

func (b *block) segment() *segment {
	if b.slab != nil {
		return b.slab.ch.seg
	}
	return b.ch.seg
}
