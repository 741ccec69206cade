package pool

import (
	"context"
	"errors"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
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

// holes is the level of the region's decommitted granules (BackingRegion).
//
// Its lock, mu, guards set, the region's geometry (base, gran: set when
// the pool adopts its region) and the counters. It comes after the depot's
// and the arena's locks (the arena consults it to prefer committed
// memory) and before the segments' and the shards' locks.
type holes struct {
	mu         sync.Mutex
	set        holeSet
	base, gran uint64 // the region's address and granularity; gran is 0 before the region
	decommits  uint64 // passes that decommitted free granules
	recommits  uint64 // chunks whose decommitted granules were committed again
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

// coversLocking is covers under mu; the caller holds the arena's lock.
func (h *holes) coversLocking(ch *chunk) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.covers(ch)
}

// take takes n bytes from the arena. With decommitted granules in the
// region (h) it prefers committed memory: among the few smallest chunks
// that fit, the first whose start (or end) needs no commit, else best fit.
// Blocks then pack into committed granules and leave whole free ones
// together, which the next decommit gives back. The caller holds mu; take
// takes h's lock.
func (a *arena) take(h *holes, n uint64) *chunk {
	i := a.fit(n)
	if i == len(a.free) {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set.n == 0 {
		return a.takeAt(i, n, false)
	}
	for k := i; k < len(a.free) && k < i+committedFitScan; k++ {
		c := a.free[k]
		if c.seg.reg == nil {
			continue
		}
		if lo, hi := h.granules(c.addr, n, false); !h.set.any(lo, hi) {
			return a.takeAt(k, n, false)
		}
		if lo, hi := h.granules(c.addr+c.size-n, n, false); !h.set.any(lo, hi) {
			return a.takeAt(k, n, true)
		}
	}
	return a.takeAt(i, n, false)
}

// committedFitScan bounds how many chunks arena.take looks at.
const committedFitScan = 16

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
func (p *Pool) relieve(ctx context.Context) {
	if p.opts.HoleSlack <= 0 {
		return
	}
	slack := uint64(float64(p.segs.heldNow()) * p.opts.HoleSlack)
	free := p.freeWholeCommitted()
	if free <= slack {
		return
	}
	_, _ = p.decommitHoles(ctx, free-slack*9/10) // a decommit that fails changes nothing
}

// freeWholeCommitted returns the bytes of the committed whole granules in
// free chunks of the region.
func (p *Pool) freeWholeCommitted() uint64 {
	a, h := &p.arena, &p.holes
	a.mu.Lock()
	defer a.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gran == 0 || p.closed.Load() {
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

// planHoles takes the free chunks with committed whole granules out of the
// arena, largest first, until their granules make wanted bytes, under the
// arena's and the holes' locks.
func (p *Pool) planHoles(wanted uint64) []holePlan {
	a, h := &p.arena, &p.holes
	a.mu.Lock()
	defer a.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if p.closed.Load() || h.gran == 0 {
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

// decommitHoles decommits the committed whole granules of free chunks
// until wanted bytes (math.MaxUint64: all of them) and returns the bytes
// decommitted. The caller holds growMu. A Decommit that fails changes
// nothing (the granules stay committed and cached); one whose release
// fails later is quarantined in pmm (Region.Quarantined, Stats.Quarantined).
func (p *Pool) decommitHoles(ctx context.Context, wanted uint64) (uint64, error) {
	plans := p.planHoles(wanted)
	if len(plans) == 0 {
		return 0, nil
	}
	//memvet:allow a borrowed reference to the pool's own region, which Close closes (closeAll); growMu is held
	r := p.segs.regionNow()
	var errs []error
	done := make([][]memapi.Range, len(plans))
	for i, pl := range plans {
		for _, rng := range pl.runs {
			if err := r.Decommit(ctx, rng); err != nil {
				errs = append(errs, err)
				continue
			}
			done[i] = append(done[i], rng)
		}
	}
	return p.holesMade(plans, done), errors.Join(errs...)
}

// holesMade books the decommitted granules and gives the busy chunks back
// to the arena, under the arena's, the holes' and the segments' locks.
func (p *Pool) holesMade(plans []holePlan, done [][]memapi.Range) uint64 {
	a, h, g := &p.arena, &p.holes, &p.segs
	p.lockRegionLevels()
	defer p.unlockRegionLevels()
	if g.rseg == nil {
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
func (p *Pool) recommit(ctx context.Context, wanted uint64, ch *chunk) error {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	// The commit raises what the pool holds, as a growth does: the other
	// whole free granules go first.
	p.relieve(ctx)
	//memvet:allow a borrowed reference to the pool's own region, which Close closes (closeAll); growMu is held
	r, runs, err := p.holeRuns(ch)
	if err != nil {
		return err
	}
	trimmed0 := p.segs.reclaimedNow()
	wctx, cancel := context.WithTimeout(ctx, p.opts.Wait)
	var done []memapi.Range
	var cerr error
	for _, rng := range runs {
		if cerr = r.Commit(wctx, rng); cerr != nil {
			break
		}
		done = append(done, rng)
	}
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err := p.holesFilled(ch, done, cerr != nil); err != nil {
		return err
	}
	if cerr != nil {
		return p.growFailed(wanted, sumRanges(runs), cerr, waited, trimmed0)
	}
	return nil
}

// holeRuns returns the region and the decommitted granules that ch
// overlaps.
func (p *Pool) holeRuns(ch *chunk) (*pmm.Region, []memapi.Range, error) {
	h, g := &p.holes, &p.segs
	h.mu.Lock()
	defer h.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.rseg == nil {
		return nil, nil, errClosed()
	}
	lo, hi := h.granules(ch.addr, ch.size, false)
	return g.region, h.runs(lo, hi, true), nil
}

// holesFilled books committed granules; on failure the busy chunk goes
// back to the arena.
func (p *Pool) holesFilled(ch *chunk, done []memapi.Range, failed bool) error {
	a, h, g := &p.arena, &p.holes, &p.segs
	p.lockRegionLevels()
	defer p.unlockRegionLevels()
	if g.rseg == nil {
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

// takenLocking is taken under the arena's lock; the caller holds the
// depot's, so the chunk goes from busy to the caller's slab unseen.
func (p *Pool) takenLocking(ch *chunk) error {
	p.arena.mu.Lock()
	defer p.arena.mu.Unlock()
	return p.taken(ch)
}

// taken ends a busy chunk's commit: it is the caller's now. The caller
// holds the arena's lock.
func (p *Pool) taken(ch *chunk) error {
	p.segs.mu.Lock()
	closed := p.closed.Load() || p.segs.rseg == nil
	p.segs.mu.Unlock()
	if closed {
		return errClosed()
	}
	p.arena.unbusy(ch)
	return nil
}
