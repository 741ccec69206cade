package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// segments is the pool's backing, the last level of its slow path, the one
// that calls pmm: the segments it holds from its binding (pmm Buffers, or
// the one Region as the arena's segment), the free huge segments (huge.go),
// and the handles it closed until pmm released them (release.go). The
// arena grows from it (allocate, growRegion).
//
// Its lock, mu, guards every field below but the region's, which New sets
// and nothing changes, and the chunk of each huge segment (its flags and
// block: huge segments are never in the arena). It comes after the
// depot's, the arena's and the holes' locks and before the shards' locks.
// No pmm call is made under it: a growth allocates with no level's lock
// held and books the new segment here after.
type segments struct {
	mu   sync.Mutex
	all  map[*segment]struct{} // the Buffers held (the region is rseg)
	held uint64                // bytes held from the binding: what the governor charges
	peak uint64                // peak held
	// huge are the free huge segments' chunks (huge.go).
	huge []*chunk
	// released are the segments the pool closed, until pmm released
	// them (release.go); a failed release stays here, quarantined.
	released []*pmm.Buffer

	allocs, frees         uint64 // segments added (region growths included), given back
	hugeAllocs, hugeFrees uint64 // huge blocks handed out and freed here
	reclaims              uint64 // Reclaim or Trim calls that gave bytes back
	overBudget, growFails uint64
	// reclaimed is the bytes they gave back, added to under mu and read
	// without it by a growth (its over-budget error says what it trimmed).
	reclaimed atomic.Uint64

	// owed are the pressure tickets Reclaim answered short, while their
	// reservations wait (debt.go).
	owed []debt

	// The pool's Region (BackingRegion), reserved by New and kept after
	// Close (its release may fail and be retried), rseg that region as
	// the arena's segment, its granularity and its reserved bytes; nil and
	// 0 with BackingSegments. None of them changes after New.
	region     *pmm.Region
	rseg       *segment
	gran, rcap uint64
	// growMu serializes the region's pmm calls (Grow, Shrink, Commit,
	// Decommit); it comes before every level's lock.
	growMu sync.Mutex

	p      *Pool // its binding, options and closed flag
	shards *shards
}

// adopt makes r, just reserved, the pool's region.
func (g *segments) adopt(r *pmm.Region) {
	g.region = r
	g.rseg = &segment{reg: r, base: uint64(r.Addr())}
	g.rseg.head = &chunk{seg: g.rseg, addr: g.rseg.base}
	g.rseg.last = g.rseg.head
	g.gran, g.rcap = uint64(r.Granularity()), uint64(r.Cap())
}

// allocate allocates a segment (a pmm Buffer) of size bytes, wanted
// bytes being the request that needs it, with no lock held, bounded by
// Options.Wait; the caller books it (book).
func (g *segments) allocate(ctx context.Context, wanted, size uint64, huge bool) (*segment, error) {
	trimmed0 := g.reclaimed.Load()
	wctx, cancel := context.WithTimeout(ctx, g.p.opts.Wait)
	buf, err := g.p.bind.Allocate(wctx, memapi.Bytes(size))
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		if errors.Is(context.Cause(ctx), errTakeAgain) {
			return nil, err // not a failed growth: the arena has a chunk (arena.grow)
		}
		return nil, g.growFailed(wanted, size, err, waited, trimmed0)
	}
	return &segment{buf: buf, base: uint64(buf.Addr()), size: uint64(buf.Size()), huge: huge}, nil
}

// book books a new segment. The caller holds mu.
func (g *segments) book(seg *segment) {
	g.all[seg] = struct{}{}
	g.add(seg.size)
	g.allocs++
}

// growRegion commits the region from old to newLen bytes (Region.Grow),
// with no level's lock held, bounded by Options.Wait; the caller holds
// growMu and adds the new range to the arena.
func (g *segments) growRegion(ctx context.Context, wanted, old, newLen uint64) error {
	if newLen > g.rcap {
		return &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrOutOfMemory, Wanted: memapi.Bytes(wanted),
			Available: memapi.Bytes(g.rcap - old), Detail: "the pool's region is full (Options.RegionBytes)"}
	}
	trimmed0 := g.reclaimed.Load()
	wctx, cancel := context.WithTimeout(ctx, g.p.opts.Wait)
	err := g.region.Grow(wctx, memapi.Bytes(newLen), nil)
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		if errors.Is(context.Cause(ctx), errTakeAgain) {
			return err // not a failed growth: the arena has a chunk (arena.grow)
		}
		return g.growFailed(wanted, newLen-old, err, waited, trimmed0)
	}
	return nil
}

// growFailed counts a failed growth and gives its error: over budget, an
// *OverBudgetError with the pool's figures beside the governor's error. A
// growth that ran past Options.Wait (the governor's wait, or the mechanism
// call after it, which sees the same context) is over budget too: the
// bytes were not there in time. trimmed0 is the pool's reclaimed bytes
// when the growth started.
func (g *segments) growFailed(wanted, size uint64, err error, waited bool, trimmed0 uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.growFails++
	if !errors.Is(err, memapi.ErrOverBudget) && !(waited && errors.Is(err, context.DeadlineExceeded)) {
		return err
	}
	g.overBudget++
	use, _ := g.shards.totals()
	inUse := uint64(use)
	auth, _ := g.p.bind.Authority()
	return &OverBudgetError{Authority: auth, Request: memapi.Bytes(wanted), Segment: memapi.Bytes(size), Held: memapi.Bytes(g.held),
		InUse: memapi.Bytes(inUse), Cached: memapi.Bytes(g.held - inUse), Trimmed: memapi.Bytes(g.reclaimed.Load() - trimmed0), Err: err}
}

// add books a new segment's bytes (or the region's).
func (g *segments) add(n uint64) {
	g.held += n
	g.peak = max(g.peak, g.held)
}

// drop takes a wholly free segment out of the pool (its figures, the
// segments held) and closes its Buffer, which stays in released until pmm
// released it (closeKept). The caller holds mu and has taken the
// segment's chunk out of the arena (or the free huge segments).
func (g *segments) drop(s *segment) error {
	delete(g.all, s)
	g.held -= s.size
	g.frees++
	return g.closeKept(s.buf)
}

// closeKept closes b, a segment's Buffer the pool gives back or cannot use,
// keeping it in released, where the retry finds it (release.go), until
// pmm released it. It is the one place the pool closes a Buffer: a Buffer
// an unlocked pmm call (allocate) returned after the pool closed
// meanwhile goes the same way, so a release of it that fails stays in the
// pool's figures and is retried by the next Trim, Reclaim or Close. The
// caller holds mu.
func (g *segments) closeKept(b *pmm.Buffer) error {
	g.released = append(g.released, b)
	return b.Close()
}

// quarantined returns the bytes of backing the pool gave back whose
// release failed, and forgets the closed segments pmm released. The caller
// holds mu.
func (g *segments) quarantined() uint64 {
	var n uint64
	kept := g.released[:0]
	for _, b := range g.released {
		switch b.State() {
		case ep.Released:
			continue
		case ep.Quarantined:
			n += uint64(b.Size())
		}
		kept = append(kept, b)
	}
	clear(g.released[len(kept):])
	g.released = kept
	if g.region != nil {
		n += uint64(g.region.Quarantined())
	}
	return n
}

// count returns the number of segments held, the region included until
// Close. The caller holds mu.
func (g *segments) count() int {
	n := len(g.all)
	if g.rseg != nil && !g.p.closed.Load() {
		n++
	}
	return n
}

// heldNow returns the bytes held, under mu.
func (g *segments) heldNow() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// countReclaim counts a Reclaim or Trim that gave freed bytes back.
func (g *segments) countReclaim(freed uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reclaims++
	g.reclaimed.Add(freed)
}

// closeLocked releases every segment and the region at Close, behind the
// fences of the blocks pending in them. The region stays the pool's: its
// release may fail and be retried (release.go). The caller holds every
// lock.
func (g *segments) closeLocked(fences map[*segment][]memapi.Fence) error {
	var errs []error
	for seg := range g.all {
		for _, f := range fences[seg] {
			errs = append(errs, seg.buf.RecordUse(f))
		}
		errs = append(errs, g.closeKept(seg.buf))
		g.frees++
	}
	if g.rseg != nil {
		for _, f := range fences[g.rseg] {
			errs = append(errs, g.region.RecordUse(f))
		}
		errs = append(errs, g.region.Close())
		g.frees++
	}
	clear(g.all)
	g.held, g.huge = 0, nil
	return errors.Join(errs...)
}
