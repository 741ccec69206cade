package pool

import (
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/pmm"
)

// segments is the pool's backing, the last level of its slow path: the
// segments it holds from its binding (pmm Buffers, or the one Region as
// the arena's segment), the free huge segments, and the handles it closed
// until pmm released them (release.go).
//
// Its lock, mu, guards every field below, and the chunk of each huge
// segment (its flags and block: huge segments are never in the arena). It
// comes after the depot's, the arena's and the holes' locks and before the
// shards' locks. No pmm call is made under it: a growth allocates with no
// level's lock held and books the new segment here after.
type segments struct {
	mu   sync.Mutex
	all  map[*segment]struct{} // the Buffers held (the region is rseg)
	held uint64                // bytes held from the binding: what the governor charges
	peak uint64                // peak held
	// huge are the free huge segments' chunks (huge.go).
	huge []*chunk
	// region is the pool's Region (BackingRegion), reserved at the first
	// growth and kept after Close (its release may fail and be retried);
	// rseg is that region as the arena's segment, nil before the first
	// growth and after Close.
	region *pmm.Region
	rseg   *segment
	// released are the segments the pool closed, until pmm released
	// them (release.go); a failed release stays here, quarantined.
	released []*pmm.Buffer

	allocs, frees         uint64 // segments added, given back
	reclaims, reclaimed   uint64 // Reclaim or Trim calls that gave bytes back, and the bytes
	overBudget, growFails uint64
}

// add books a new segment's bytes.
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

// closeKept closes h, a handle the pool gives back or cannot use (a
// segment's Buffer, the region), keeping it where the retry finds it
// (toRetry) until pmm released it: a Buffer in released, a region as the
// pool's region (a pool has one, kept after Close). It is the one place
// the pool closes a handle: a handle an unlocked pmm call (growSegment,
// adoptRegion) returned after the pool closed meanwhile goes the same way,
// so a release of it that fails stays in the pool's figures and is
// retried by the next Trim, Reclaim or Close. The caller holds mu.
func (g *segments) closeKept(h interface{ Close() error }) error {
	switch h := h.(type) {
	case *pmm.Buffer:
		g.released = append(g.released, h)
	case *pmm.Region:
		g.region = h
	}
	return h.Close()
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

// count returns the number of segments held, the region included.
func (g *segments) count() int {
	n := len(g.all)
	if g.rseg != nil {
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

// reclaimedNow returns the bytes the pool's Reclaim and Trim gave back so
// far, under mu: a growth's over-budget error reports what it trimmed
// meanwhile.
func (g *segments) reclaimedNow() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reclaimed
}

// regionNow returns the pool's region (nil before the first growth),
// under mu.
func (g *segments) regionNow() *pmm.Region {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.region
}

// countReclaim counts a Reclaim or Trim that gave freed bytes back.
func (g *segments) countReclaim(freed uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reclaims++
	g.reclaimed += freed
}
