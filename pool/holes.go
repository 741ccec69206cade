package pool

import (
	"context"
	"errors"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Holes (BackingRegion): whole granules of the region inside free chunks
// can be decommitted (pmm.Region.Decommit) without moving any block.
// Reclaim and Trim, once the region's free tail is given back, decommit
// the whole free granules still committed; with Options.HoleSlack above 0
// so does every rise of the committed bytes (a growth, a recommit) when
// they are more than the slack (relieve). A chunk the arena hands out that
// covers decommitted granules is committed again first (pmm.Region.Commit).
// So what the pool holds, and what the governor charges it, is the
// region's committed bytes:
//
//	Segments == region length - decommitted granules
//	Cached   == free and busy chunks + free small blocks + pending - decommitted granules
//
// Decommitted granules lie only in free chunks (in the arena) or in busy
// ones: a chunk taken out of the arena while its granules are decommitted
// or committed outside every level's lock (neither a taker nor the
// coalescing of a neighbour touches it meanwhile). Every pmm call is made
// holding growMu (the pool's region transactions are serialized there) and
// no level's lock.

// holes is the level of the region's decommitted granules (BackingRegion):
// it commits again the granules of a chunk the arena hands out, and
// decommits the whole free granules of the arena's chunks.
//
// Its lock, mu, guards set and the counters; the region's geometry (base,
// gran) is set by New. It comes after the depot's and the arena's locks
// (the arena consults it to prefer committed memory) and before the
// segments' and the shards' locks.
type holes struct {
	mu         sync.Mutex
	set        holeSet
	base, gran uint64  // the region's address and granularity; gran is 0 without a region
	slack      float64 // Options.HoleSlack
	decommits  uint64  // passes that decommitted free granules
	recommits  uint64  // chunks whose decommitted granules were committed again

	p     *Pool // its options and closed flag
	arena *arena
	segs  *segments
}

// holeSet is the set of the region's decommitted granules, by index.
type holeSet struct {
	words []uint64
	n     uint64 // granules in the set
}

func (h *holeSet) has(i uint64) bool {
	w := i / 64
	return w < uint64(len(h.words)) && h.words[w]&(1<<(i%64)) != 0
}

func (h *holeSet) add(i uint64) {
	w := i / 64
	for uint64(len(h.words)) <= w {
		h.words = append(h.words, 0)
	}
	if h.words[w]&(1<<(i%64)) == 0 {
		h.words[w] |= 1 << (i % 64)
		h.n++
	}
}

func (h *holeSet) del(i uint64) {
	if h.has(i) {
		h.words[i/64] &^= 1 << (i % 64)
		h.n--
	}
}

// any reports whether a granule in [lo, hi) is in the set.
func (h *holeSet) any(lo, hi uint64) bool {
	for i := lo; i < hi; {
		w := i / 64
		if w >= uint64(len(h.words)) {
			return false
		}
		if h.words[w] == 0 {
			i = (w + 1) * 64
			continue
		}
		if h.has(i) {
			return true
		}
		i++
	}
	return false
}

// granules returns the index range of the granules that overlap
// [addr, addr+size) (outer) or lie wholly in it (inner). The caller holds
// mu.
func (h *holes) granules(addr, size uint64, inner bool) (lo, hi uint64) {
	g := h.gran
	off := addr - h.base
	if inner {
		return (off + g - 1) / g, (off + size) / g
	}
	return off / g, (off + size + g - 1) / g
}

// bytes is the bytes of the region's decommitted granules. The caller
// holds mu.
func (h *holes) bytes() uint64 { return h.set.n * h.gran }

// covers reports whether the chunk overlaps a decommitted granule. The
// caller holds mu and the arena's lock.
func (h *holes) covers(ch *chunk) bool {
	if h.set.n == 0 || ch.seg.reg == nil {
		return false
	}
	lo, hi := h.granules(ch.addr, ch.size, false)
	return h.set.any(lo, hi)
}

// runs returns the region ranges of the granules in [lo, hi) that are in
// the set (want) or not. The caller holds mu.
func (h *holes) runs(lo, hi uint64, want bool) []memapi.Range {
	g := memapi.Bytes(h.gran)
	var out []memapi.Range
	for i := lo; i < hi; i++ {
		if h.set.has(i) != want {
			continue
		}
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == memapi.Bytes(i)*g {
			out[k].Len += g
			continue
		}
		out = append(out, memapi.Range{Off: memapi.Bytes(i) * g, Len: g})
	}
	return out
}

func sumRanges(rs []memapi.Range) (n uint64) {
	for _, r := range rs {
		n += uint64(r.Len)
	}
	return n
}

// relieve runs before the pool's committed bytes rise (a growth, a
// recommit): when the whole free granules still committed are more than
// the slack (Options.HoleSlack of what is held), the largest free chunks'
// granules are decommitted until nine tenths of the slack are left. The
// slack keeps the pmm calls, and the recommits of granules given back a
// moment earlier, few. The caller holds growMu.
func (h *holes) relieve(ctx context.Context) {
	if h.slack <= 0 {
		return
	}
	slack := uint64(float64(h.segs.heldNow()) * h.slack)
	free := h.freeWholeCommitted()
	if free <= slack {
		return
	}
	_, _ = h.decommit(ctx, free-slack*9/10) // a decommit that fails changes nothing
}

// freeWholeCommitted returns the bytes of the committed whole granules in
// free chunks of the region.
func (h *holes) freeWholeCommitted() uint64 {
	a := h.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gran == 0 || h.p.closed.Load() {
		return 0
	}
	g := h.gran
	var n uint64
	for _, c := range a.free {
		if c.size < g || c.seg.reg == nil {
			continue
		}
		lo, hi := h.granules(c.addr, c.size, true)
		for k := lo; k < hi; k++ {
			if !h.set.has(k) {
				n += g
			}
		}
	}
	return n
}

// holePlan is a free chunk taken out of the arena (busy) and the committed
// whole granules in it to decommit.
type holePlan struct {
	ch   *chunk
	runs []memapi.Range
}

// plan takes the free chunks with committed whole granules out of the
// arena, largest first, until their granules make wanted bytes, under the
// arena's and the holes' locks.
func (h *holes) plan(wanted uint64) []holePlan {
	a := h.arena
	a.mu.Lock()
	defer a.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.p.closed.Load() || h.gran == 0 {
		return nil
	}
	var plans []holePlan
	var sum uint64
	for i := len(a.free) - 1; i >= 0 && sum < wanted; i-- {
		c := a.free[i]
		if c.seg.reg == nil {
			continue
		}
		lo, hi := h.granules(c.addr, c.size, true)
		if lo >= hi {
			continue
		}
		runs := h.runs(lo, hi, false)
		if len(runs) == 0 {
			continue
		}
		plans = append(plans, holePlan{c, runs})
		sum += sumRanges(runs)
	}
	for _, pl := range plans {
		a.remove(pl.ch)
		a.markBusy(pl.ch)
	}
	return plans
}

// decommit decommits the committed whole granules of free chunks until
// wanted bytes (math.MaxUint64: all of them) and returns the bytes
// decommitted. The caller holds growMu. A Decommit that fails changes
// nothing (the granules stay committed and cached); one whose release
// fails later is quarantined in pmm (Region.Quarantined, Stats.Quarantined).
func (h *holes) decommit(ctx context.Context, wanted uint64) (uint64, error) {
	plans := h.plan(wanted)
	if len(plans) == 0 {
		return 0, nil
	}
	var errs []error
	done := make([][]memapi.Range, len(plans))
	for i, pl := range plans {
		for _, rng := range pl.runs {
			if err := h.segs.region.Decommit(ctx, rng); err != nil {
				errs = append(errs, err)
				continue
			}
			done[i] = append(done[i], rng)
		}
	}
	return h.made(plans, done), errors.Join(errs...)
}

// made books the decommitted granules and gives the busy chunks back to
// the arena, under the arena's, the holes' and the segments' locks.
func (h *holes) made(plans []holePlan, done [][]memapi.Range) uint64 {
	a, g := h.arena, h.segs
	a.lockRegion()
	defer a.unlockRegion()
	if h.p.closed.Load() {
		return 0 // Close came meanwhile; the region's release has the rest
	}
	var freed uint64
	for i, pl := range plans {
		for _, rng := range done[i] {
			for k := uint64(rng.Off) / h.gran; k < uint64(rng.Off+rng.Len)/h.gran; k++ {
				h.set.add(k)
			}
			freed += uint64(rng.Len)
		}
		a.unbusy(pl.ch)
		a.give(pl.ch)
	}
	g.held -= freed
	if freed > 0 {
		h.decommits++
	}
	return freed
}

// recommit commits the decommitted granules that a chunk taken from the
// arena (busy meanwhile) covers, outside every level's lock and holding
// growMu, bounded by Options.Wait like a growth. On a failure the chunk
// goes back to the arena; granules committed before it stay committed, as
// cache.
func (h *holes) recommit(ctx context.Context, wanted uint64, ch *chunk) error {
	g := h.segs
	g.growMu.Lock()
	defer g.growMu.Unlock()
	// The commit raises what the pool holds, as a growth does: the other
	// whole free granules go first.
	h.relieve(ctx)
	runs, err := h.decommitted(ch)
	if err != nil {
		return err
	}
	trimmed0 := g.reclaimed.Load()
	wctx, cancel := context.WithTimeout(ctx, h.p.opts.Wait)
	var done []memapi.Range
	var cerr error
	for _, rng := range runs {
		if cerr = g.region.Commit(wctx, rng); cerr != nil {
			break
		}
		done = append(done, rng)
	}
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err := h.filled(ch, done, cerr != nil); err != nil {
		return err
	}
	if cerr != nil {
		return g.growFailed(wanted, sumRanges(runs), cerr, waited, trimmed0)
	}
	return nil
}

// decommitted returns the decommitted granules that ch overlaps.
func (h *holes) decommitted(ch *chunk) ([]memapi.Range, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.p.closed.Load() {
		return nil, errClosed()
	}
	lo, hi := h.granules(ch.addr, ch.size, false)
	return h.runs(lo, hi, true), nil
}

// filled books committed granules; on failure the busy chunk goes back to
// the arena.
func (h *holes) filled(ch *chunk, done []memapi.Range, failed bool) error {
	a, g := h.arena, h.segs
	a.lockRegion()
	defer a.unlockRegion()
	if h.p.closed.Load() {
		return errClosed() // Close came meanwhile; the region's release has it all
	}
	for _, rng := range done {
		for k := uint64(rng.Off) / h.gran; k < uint64(rng.Off+rng.Len)/h.gran; k++ {
			h.set.del(k)
		}
		g.add(uint64(rng.Len))
	}
	if len(done) > 0 {
		h.recommits++
	}
	if failed {
		a.unbusy(ch)
		a.give(ch)
	}
	return nil
}
