package pool

import (
	"context"
	"errors"

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
// or committed outside the pool's mutex (neither a taker nor the coalescing
// of a neighbour touches it meanwhile). Every pmm call is made holding
// growMu (the pool's region transactions are serialized there) and not mu.

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
// [addr, addr+size) (outer) or lie wholly in it (inner).
func (p *Pool) granules(addr, size uint64, inner bool) (lo, hi uint64) {
	g := uint64(p.region.Granularity())
	off := addr - p.rseg.base
	if inner {
		return (off + g - 1) / g, (off + size) / g
	}
	return off / g, (off + size + g - 1) / g
}

// holeBytesLocked is the bytes of the region's decommitted granules.
func (p *Pool) holeBytesLocked() uint64 {
	if p.region == nil {
		return 0
	}
	return p.holes.n * uint64(p.region.Granularity())
}

// coversHolesLocked reports whether the chunk overlaps a decommitted
// granule.
func (p *Pool) coversHolesLocked(ch *chunk) bool {
	if p.holes.n == 0 || p.rseg == nil || ch.seg != p.rseg {
		return false
	}
	lo, hi := p.granules(ch.addr, ch.size, false)
	return p.holes.any(lo, hi)
}

// takeLocked takes n bytes from the arena. With decommitted granules in
// the region it prefers committed memory: among the few smallest chunks
// that fit, the first whose start (or end) needs no commit, else best fit.
// Blocks then pack into committed granules and leave whole free ones
// together, which the next decommit gives back.
func (p *Pool) takeLocked(n uint64) *chunk {
	a := &p.arena
	i := a.fit(n)
	if i == len(a.free) {
		return nil
	}
	if p.holes.n == 0 || p.rseg == nil {
		return a.takeAt(i, n, false)
	}
	for k := i; k < len(a.free) && k < i+committedFitScan; k++ {
		c := a.free[k]
		if c.seg != p.rseg {
			continue
		}
		if lo, hi := p.granules(c.addr, n, false); !p.holes.any(lo, hi) {
			return a.takeAt(k, n, false)
		}
		if lo, hi := p.granules(c.addr+c.size-n, n, false); !p.holes.any(lo, hi) {
			return a.takeAt(k, n, true)
		}
	}
	return a.takeAt(i, n, false)
}

// committedFitScan bounds how many chunks takeLocked looks at.
const committedFitScan = 16

func (p *Pool) busyLocked(ch *chunk) {
	ch.busy = true
	p.busyBytes += ch.size
}

func (p *Pool) unbusyLocked(ch *chunk) {
	ch.busy = false
	p.busyBytes -= ch.size
}

// runs returns the region ranges of the granules in [lo, hi) that are in
// the set (want) or not.
func (p *Pool) runs(lo, hi uint64, want bool) []memapi.Range {
	g := memapi.Bytes(p.region.Granularity())
	var out []memapi.Range
	for i := lo; i < hi; i++ {
		if p.holes.has(i) != want {
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
	slack := uint64(float64(p.heldNow()) * p.opts.HoleSlack)
	free := p.freeWholeCommitted()
	if free <= slack {
		return
	}
	_, _ = p.decommitHoles(ctx, free-slack*9/10) // a decommit that fails changes nothing
}

func (p *Pool) heldNow() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// freeWholeCommitted returns the bytes of the committed whole granules in
// free chunks of the region.
func (p *Pool) freeWholeCommitted() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rseg == nil {
		return 0
	}
	g := uint64(p.region.Granularity())
	var n uint64
	for _, c := range p.arena.free {
		if c.size < g || c.seg != p.rseg {
			continue
		}
		lo, hi := p.granules(c.addr, c.size, true)
		for k := lo; k < hi; k++ {
			if !p.holes.has(k) {
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

// planHolesLocked takes the free chunks with committed whole granules out
// of the arena, largest first, until their granules make wanted bytes.
func (p *Pool) planHolesLocked(wanted uint64) []holePlan {
	if p.closed.Load() || p.rseg == nil {
		return nil
	}
	var plans []holePlan
	var sum uint64
	for i := len(p.arena.free) - 1; i >= 0 && sum < wanted; i-- {
		c := p.arena.free[i]
		if c.seg != p.rseg {
			continue
		}
		lo, hi := p.granules(c.addr, c.size, true)
		if lo >= hi {
			continue
		}
		runs := p.runs(lo, hi, false)
		if len(runs) == 0 {
			continue
		}
		plans = append(plans, holePlan{c, runs})
		sum += sumRanges(runs)
	}
	for _, pl := range plans {
		p.arena.remove(pl.ch)
		p.busyLocked(pl.ch)
	}
	return plans
}

// decommitHoles decommits the committed whole granules of free chunks
// until wanted bytes (math.MaxUint64: all of them) and returns the bytes
// decommitted. The caller holds growMu. A Decommit that fails changes
// nothing (the granules stay committed and cached); one whose release
// fails later is quarantined in pmm (Region.Quarantined, Stats.Quarantined).
func (p *Pool) decommitHoles(ctx context.Context, wanted uint64) (uint64, error) {
	plans := p.lockedPlan(wanted)
	if len(plans) == 0 {
		return 0, nil
	}
	var errs []error
	done := make([][]memapi.Range, len(plans))
	for i, pl := range plans {
		for _, rng := range pl.runs {
			if err := p.region.Decommit(ctx, rng); err != nil {
				errs = append(errs, err)
				continue
			}
			done[i] = append(done[i], rng)
		}
	}
	return p.holesMade(plans, done), errors.Join(errs...)
}

func (p *Pool) lockedPlan(wanted uint64) []holePlan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.planHolesLocked(wanted)
}

// holesMade books the decommitted granules and gives the busy chunks back
// to the arena.
func (p *Pool) holesMade(plans []holePlan, done [][]memapi.Range) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rseg == nil {
		return 0 // Close came meanwhile; the region's release has the rest
	}
	g := uint64(p.region.Granularity())
	var freed uint64
	for i, pl := range plans {
		for _, rng := range done[i] {
			for k := uint64(rng.Off) / g; k < uint64(rng.Off+rng.Len)/g; k++ {
				p.holes.add(k)
			}
			freed += uint64(rng.Len)
		}
		p.unbusyLocked(pl.ch)
		p.arena.give(pl.ch)
	}
	p.held -= freed
	if freed > 0 {
		p.c.decommits++
	}
	return freed
}

// recommit commits the decommitted granules that a chunk taken from the
// arena (busy meanwhile) covers, outside mu and holding growMu, bounded by
// Options.Wait like a growth. On a failure the chunk goes back to the
// arena; granules committed before it stay committed, as cache.
func (p *Pool) recommit(ctx context.Context, wanted uint64, ch *chunk) error {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	// The commit raises what the pool holds, as a growth does: the other
	// whole free granules go first.
	p.relieve(ctx)
	runs, err := p.holeRuns(ch)
	if err != nil {
		return err
	}
	trimmed0 := p.reclaimedNow()
	wctx, cancel := context.WithTimeout(ctx, p.opts.Wait)
	var done []memapi.Range
	var cerr error
	for _, rng := range runs {
		if cerr = p.region.Commit(wctx, rng); cerr != nil {
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

// holeRuns returns the decommitted granules that ch overlaps.
func (p *Pool) holeRuns(ch *chunk) ([]memapi.Range, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rseg == nil {
		return nil, errClosed()
	}
	lo, hi := p.granules(ch.addr, ch.size, false)
	return p.runs(lo, hi, true), nil
}

// holesFilled books committed granules; on failure the busy chunk goes
// back to the arena.
func (p *Pool) holesFilled(ch *chunk, done []memapi.Range, failed bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rseg == nil {
		return errClosed() // Close came meanwhile; the region's release has it all
	}
	g := uint64(p.region.Granularity())
	for _, rng := range done {
		for k := uint64(rng.Off) / g; k < uint64(rng.Off+rng.Len)/g; k++ {
			p.holes.del(k)
		}
		p.held += uint64(rng.Len)
	}
	p.peak = max(p.peak, p.held)
	if len(done) > 0 {
		p.c.recommits++
	}
	if failed {
		p.unbusyLocked(ch)
		p.arena.give(ch)
	}
	return nil
}

// takenLocked ends a busy chunk's commit: it is the caller's now.
func (p *Pool) takenLocked(ch *chunk) error {
	if p.closed.Load() || p.rseg == nil {
		return errClosed()
	}
	p.unbusyLocked(ch)
	return nil
}
