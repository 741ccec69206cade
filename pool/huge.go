package pool

import (
	"context"
	"errors"
	"slices"

	"github.com/memgen/memgen/ep"
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

// takeHuge takes the best-fitting free huge segment for r under mu; ok is
// false when none fits.
func (p *Pool) takeHuge(r, n uint64, s memapi.Stream) (Block, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return Block{}, false, errClosed()
	}
	p.sweepLocked()
	best := -1
	for i, c := range p.hugeFree {
		if hugeFits(c.size, r) && (best < 0 || c.size < p.hugeFree[best].size) {
			best = i
		}
	}
	if best < 0 {
		return Block{}, false, nil
	}
	ch := p.hugeFree[best]
	p.hugeFree = slices.Delete(p.hugeFree, best, best+1)
	ch.free = false
	b := &block{p: p, addr: ch.addr, size: ch.size, ch: ch}
	b.word.Store(pack(0, ep.Released))
	ch.blk = b
	p.c.largeAllocs++
	return p.hand(b, n, s), true, nil
}

// giveLocked frees a large block's chunk: back to its huge segment's free
// list, or to the arena, coalesced.
func (p *Pool) giveLocked(ch *chunk) {
	if ch.seg.huge {
		ch.blk = nil
		ch.free = true
		p.hugeFree = append(p.hugeFree, ch)
		return
	}
	p.arena.give(ch)
}

// growHuge adds a huge segment of at least r bytes, after closing the free
// huge segments that did not fit.
func (p *Pool) growHuge(ctx context.Context, n, r uint64) error {
	if err := p.releaseFreeHuge(); err != nil {
		return err
	}
	return p.growSegment(ctx, n, r, true)
}

// releaseFreeHuge closes every free huge segment: before a huge growth,
// cached huge bytes that fit no request go back rather than add to the
// peak.
func (p *Pool) releaseFreeHuge() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, c := range p.hugeFree {
		errs = append(errs, p.dropSegmentLocked(c.seg))
	}
	clear(p.hugeFree)
	p.hugeFree = p.hugeFree[:0]
	return errors.Join(errs...)
}

// dropSegmentLocked takes a wholly free segment out of the pool (its
// figures, the segments it holds) and closes its Buffer, which stays in
// released until pmm released it (closeKeptLocked).
func (p *Pool) dropSegmentLocked(s *segment) error {
	delete(p.segs, s)
	p.held -= s.size
	p.c.segFrees++
	return p.closeKeptLocked(s.buf)
}
