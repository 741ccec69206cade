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

// retry queues again the release of every closed segment whose release
// failed, and removes the region's quarantined backing (or queues the
// closed region's failed release again). A region transaction is not
// waited for: while the pool's own growth holds it, the growth removes the
// quarantined backing first anyway (Region.Grow). What still fails stays
// quarantined and visible.
func (g *segments) retry(ctx context.Context) error {
	var errs []error
	for _, b := range g.toRetry() {
		errs = append(errs, b.Retry())
	}
	if r := g.region; r != nil && g.growMu.TryLock() {
		defer g.growMu.Unlock()
		if r.State() == ep.Quarantined || (r.State() == ep.Open && r.Quarantined() > 0) {
			errs = append(errs, r.Retry(ctx))
		}
	}
	return errors.Join(errs...)
}

// toRetry returns the closed segments whose release failed, under mu.
func (g *segments) toRetry() []*pmm.Buffer {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.quarantined()
	var out []*pmm.Buffer
	for _, b := range g.released {
		if b.State() == ep.Quarantined {
			out = append(out, b)
		}
	}
	return out
}
