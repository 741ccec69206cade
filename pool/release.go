package pool

import (
	"context"
	"errors"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/pmm"
)

// The pool gives backing back by closing it: a segment's pmm Buffer (Trim,
// Reclaim, Close), the region's free tail (Region.Shrink) or the region
// itself (Close). pmm releases it behind its fences on the deferred-free
// queue; a release that fails is quarantined there: its bytes stay charged
// to the pool's holder as quarantined (governor snapshot), and the
// mechanism still holds them. The pool keeps every handle it closed until
// pmm released it, so that those bytes stay in its own figures
// (Stats.Quarantined) and so that the next Trim, Reclaim or Close retries
// them. The identity, once fences and the queue are drained:
//
//	Cached + InUse == Segments
//	governor charge == Segments + Quarantined (of which Quarantined quarantined)
//	mechanism's bytes == Segments + Quarantined

// closeKeptLocked closes h, a handle the pool gives back or cannot use (a
// segment's Buffer, the region), keeping it where the retry finds it
// (toRetry) until pmm released it: a Buffer in released, a region as the
// pool's region (a pool has one, kept after Close). It is the one place
// the pool closes a handle: a handle an unlocked pmm call (growSegment,
// adoptRegion) returned after the pool closed meanwhile goes the same way,
// so a release of it that fails stays in the pool's figures and is
// retried by the next Trim, Reclaim or Close. The caller holds mu.
func (p *Pool) closeKeptLocked(h interface{ Close() error }) error {
	switch h := h.(type) {
	case *pmm.Buffer:
		p.released = append(p.released, h)
	case *pmm.Region:
		p.region = h
	}
	return h.Close()
}

// quarantinedLocked returns the bytes of backing the pool gave back whose
// release failed, and forgets the closed segments pmm released.
func (p *Pool) quarantinedLocked() uint64 {
	var n uint64
	kept := p.released[:0]
	for _, b := range p.released {
		switch b.State() {
		case ep.Released:
			continue
		case ep.Quarantined:
			n += uint64(b.Size())
		}
		kept = append(kept, b)
	}
	clear(p.released[len(kept):])
	p.released = kept
	if p.region != nil {
		n += uint64(p.region.Quarantined())
	}
	return n
}

// retryReleases queues again the release of every closed segment whose
// release failed, and removes the region's quarantined backing (or queues
// the closed region's failed release again). A region transaction is not
// waited for: while the pool's own growth holds it, the growth removes the
// quarantined backing first anyway (Region.Grow). What still fails stays
// quarantined and visible.
func (p *Pool) retryReleases(ctx context.Context) error {
	//memvet:allow a borrowed reference to the pool's own region, which Close closes (closeLocked)
	bufs, r := p.toRetry()
	var errs []error
	for _, b := range bufs {
		errs = append(errs, b.Retry())
	}
	if r != nil && p.growMu.TryLock() {
		defer p.growMu.Unlock()
		if r.State() == ep.Quarantined || (r.State() == ep.Open && r.Quarantined() > 0) {
			errs = append(errs, r.Retry(ctx))
		}
	}
	return errors.Join(errs...)
}

func (p *Pool) toRetry() ([]*pmm.Buffer, *pmm.Region) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.quarantinedLocked()
	var out []*pmm.Buffer
	for _, b := range p.released {
		if b.State() == ep.Quarantined {
			out = append(out, b)
		}
	}
	return out, p.region
}
