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

// takeHuge takes the best-fitting free huge segment for r, under the
// depot's lock (it sweeps the pending blocks) and the segments'; ok is
// false when none fits.
func (p *Pool) takeHuge(r, n uint64, s memapi.Stream) (Block, bool, error) {
	p.depot.mu.Lock()
	defer p.depot.mu.Unlock()
	if p.closed.Load() {
		return Block{}, false, errClosed()
	}
	p.sweep()
	g := &p.segs
	g.mu.Lock()
	defer g.mu.Unlock()
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
	b := &block{p: p, addr: ch.addr, size: ch.size, ch: ch}
	b.word.Store(pack(0, ep.Released))
	ch.blk = b
	p.largeAllocs.Add(1)
	return p.hand(b, n, s), true, nil
}

// giveHuge frees a huge segment's chunk: back to the free huge segments.
// The caller holds mu.
func (g *segments) giveHuge(ch *chunk) {
	ch.blk = nil
	ch.free = true
	g.huge = append(g.huge, ch)
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
	g := &p.segs
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
