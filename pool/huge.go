package pool

import (
	"context"
	"errors"
	"slices"

	"github.com/memgen/memgen/generated/memapi"
)

// A request of at least Options.HugeBytes gets a segment of its own (a pmm
// Buffer of about its size) whichever the backing, holding that one block
// at a time and never split for a smaller request: PyTorch's caching
// allocator serves requests above 10 MiB from exact segments and does not
// split blocks above max_split_size. A huge block carved from the shared
// arena left a hole that the next run's smaller requests split, so that
// the same huge request a run later found no room and the pool grew
// (ONNX Runtime's recorded sequence: 48 MiB held for 38 MiB asked).
//
// A free huge segment serves a later huge request of at least half its size
// (hugeFits). One that fits no request is closed before another huge
// segment is allocated, so two huge segments where one would do never add
// to the peak; it stays while the region or the other segments grow (closing
// it then made ONNX Runtime's sequence reallocate its largest tensors every
// run: 2.5 times the pool's time for the same fragmentation).

// hugeFits reports whether a free huge segment of size bytes serves a
// request rounded to r bytes: at most r bytes of it unused, as a huge
// segment's block takes it whole (its Rounded size).
func hugeFits(size, r uint64) bool { return size >= r && size-r <= r }

// allocHuge serves a huge request (r bytes rounded, n asked): the
// best-fitting free huge segment, else a new one, after the free huge
// segments that fit no request are closed.
func (g *segments) allocHuge(ctx context.Context, r, n uint64, s memapi.Stream) (Block, error) {
	for {
		h, ok, err := g.takeHuge(r, n, s)
		if ok || err != nil {
			return h, err
		}
		if err := g.growHuge(ctx, n, r); err != nil {
			return Block{}, err
		}
	}
}

// takeHuge hands out the best-fitting free huge segment for r as a block;
// ok is false when none fits.
func (g *segments) takeHuge(r, n uint64, s memapi.Stream) (Block, bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.p.closed.Load() {
		return Block{}, false, errClosed()
	}
	best := -1
	for i, c := range g.huge {
		if hugeFits(c.size, r) && (best < 0 || c.size < g.huge[best].size) {
			best = i
		}
	}
	if best < 0 {
		return Block{}, false, nil
	}
	ch := g.huge[best]
	g.huge = slices.Delete(g.huge, best, best+1)
	ch.free = false
	b := &block{p: g.p, addr: ch.addr, size: ch.size, req: n, stream: s, ch: ch} // Open in generation 0 (block.go)
	ch.blk = b
	g.hugeAllocs++
	g.shards.count(ch.size, n)
	return Block{b: b}, true, nil
}

// giveHuge frees a huge segment's chunk: back to the free huge segments.
// The caller holds mu.
func (g *segments) giveHuge(ch *chunk) {
	ch.blk = nil
	ch.free = true
	g.huge = append(g.huge, ch)
}

// giveHugeLocking is giveHuge under mu.
func (g *segments) giveHugeLocking(ch *chunk) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.giveHuge(ch)
}

// freeHuge gives a huge block's segment back to the free huge segments,
// or, while the pool owes a waiting reservation bytes (debt.go), to the
// governor. A release that fails there stays quarantined in released
// (Stats.Quarantined) and is retried and reported by the next Trim,
// Reclaim or Close.
func (g *segments) freeHuge(b *block) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shards.uncount(b)
	g.hugeFrees++
	if !g.p.closed.Load() && g.settle(b.ch.seg.size) {
		b.ch.blk = nil
		_ = g.drop(b.ch.seg)
		return
	}
	g.giveHuge(b.ch)
}

// growHuge adds a huge segment of at least r bytes, after closing the free
// huge segments that did not fit: cached huge bytes that fit no request
// go back rather than add to the peak.
func (g *segments) growHuge(ctx context.Context, n, r uint64) error {
	if err := g.releaseFreeHuge(); err != nil {
		return err
	}
	seg, err := g.allocate(ctx, n, r, true)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.p.closed.Load() {
		return errors.Join(errClosed(), g.closeKept(seg.buf))
	}
	g.book(seg)
	seg.head = &chunk{seg: seg, addr: seg.base, size: seg.size}
	seg.last = seg.head
	g.giveHuge(seg.head)
	return nil
}

// releaseFreeHuge closes every free huge segment.
func (g *segments) releaseFreeHuge() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for _, c := range g.huge {
		errs = append(errs, g.drop(c.seg))
	}
	clear(g.huge)
	g.huge = g.huge[:0]
	return errors.Join(errs...)
}
