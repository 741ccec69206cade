package pool

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// BackingRegion is one stable growable pmm Region per pool (expandable
// segments): growth commits at the end, trimming decommits the free tail,
// and whole free granules inside it are decommitted and committed again
// in place (holes.go).
// Addresses never move. The pool's arena is then one segment whose size is
// the region's length.
const BackingRegion Backing = "region"

// regionGrow extends the region by at least need bytes past its free tail.
// Grows are serialized by growMu; the new range joins the arena only after
// Grow committed, so a rollback has nothing to take back.
func (p *Pool) regionGrow(ctx context.Context, wanted, need uint64) error {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	if p.closed.Load() {
		return errClosed()
	}
	//memvet:allow a borrowed reference to the pool's own region, which Close closes (closeAll); growMu is held
	r := p.segs.regionNow()
	if r == nil {
		var err error
		if r, err = p.bind.ReserveVirtual(ctx, p.opts.RegionBytes); err != nil {
			return err
		}
		if err := p.adoptRegion(r); err != nil {
			return err
		}
	}
	free, old, err := p.regionTail()
	if err != nil {
		return err
	}
	if free >= need {
		return nil // another grow made room meanwhile
	}
	// Before the region grows, the whole free granules inside it go back
	// (holes.go): the peak held is then what the blocks cover, not the
	// holes between them. A decommit that fails changes nothing here.
	p.relieve(ctx)
	gran := uint64(r.Granularity())
	newLen := (old + max(need-free, uint64(p.opts.SegmentBytes)) + gran - 1) / gran * gran
	if newLen > uint64(r.Cap()) {
		return &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrOutOfMemory, Wanted: memapi.Bytes(wanted),
			Available: memapi.Bytes(uint64(r.Cap()) - old), Detail: "the pool's region is full (Options.RegionBytes)"}
	}
	trimmed0 := p.segs.reclaimedNow()
	wctx, cancel := context.WithTimeout(ctx, p.opts.Wait)
	err = r.Grow(wctx, memapi.Bytes(newLen), func(memapi.Bytes) error { return nil })
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		return p.growFailed(wanted, newLen-old, err, waited, trimmed0)
	}
	return p.extend(uint64(r.Len()))
}

// adoptRegion makes r the pool's region; when the pool closed meanwhile,
// it closes r, kept as the closed pool's region (segments.closeKept).
func (p *Pool) adoptRegion(r *pmm.Region) error {
	h, g := &p.holes, &p.segs
	h.mu.Lock()
	defer h.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.closed.Load() {
		return errors.Join(errClosed(), g.closeKept(r))
	}
	g.region = r
	g.rseg = &segment{reg: r, base: uint64(r.Addr())}
	g.rseg.head = &chunk{seg: g.rseg, addr: g.rseg.base}
	h.base, h.gran = g.rseg.base, uint64(r.Granularity())
	return nil
}

// regionTail returns the bytes free at the region's end and its length.
func (p *Pool) regionTail() (free, size uint64, err error) {
	a, g := &p.arena, &p.segs
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.closed.Load() || g.rseg == nil {
		return 0, 0, errClosed()
	}
	if t := g.rseg.tail(); t.free {
		free = t.size
	}
	return free, g.rseg.size, nil
}

// extend makes the region's arena segment size bytes long, the new range
// one free chunk (coalesced with a free tail), under the arena's and the
// segments' locks.
func (p *Pool) extend(size uint64) error {
	a, g := &p.arena, &p.segs
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.rseg
	if s == nil {
		return errClosed() // Close came meanwhile; the region's release has the range
	}
	g.allocs++
	add := size - s.size
	if add == 0 {
		return nil
	}
	if s.size == 0 {
		s.head.size = add
		a.insert(s.head)
	} else {
		t := s.tail()
		c := &chunk{seg: s, addr: s.base + s.size, size: add, prev: t}
		t.next = c
		a.give(c)
	}
	s.size = size
	g.add(add)
	return nil
}

// regionTrim decommits the region's free tail (rounded to the granularity)
// once wanted is more than 0, then, while that was fewer than wanted, the
// whole free granules inside the region (holes.go). It never waits for a
// grow or a recommit in flight (the grow may be the reservation that
// asked): it gives 0 then.
func (p *Pool) regionTrim(ctx context.Context, wanted uint64) (uint64, error) {
	if wanted == 0 || !p.growMu.TryLock() {
		return 0, nil
	}
	defer p.growMu.Unlock()
	freed, err := p.trimTail(ctx, wanted)
	if freed >= wanted || err != nil {
		return freed, err
	}
	n, err := p.decommitHoles(ctx, wanted-freed)
	return freed + n, err
}

// trimTail shrinks the region by its free tail's last granules, as many as
// hold wanted committed bytes (math.MaxUint64: to the start of the free
// tail), so that a ticket for a little gets about that little and the next
// growth does not have to commit back what nobody asked for. The caller
// holds growMu.
func (p *Pool) trimTail(ctx context.Context, wanted uint64) (uint64, error) {
	//memvet:allow a borrowed reference to the pool's own region, which Close closes (closeAll) and release.go retries
	r, keep, old, ok := p.freeTail(wanted)
	if !ok {
		return 0, nil
	}
	var freed uint64
	err := r.Shrink(ctx, memapi.Bytes(keep), func(memapi.Bytes) error {
		var err error
		freed, err = p.cutTail(keep, old)
		return err
	})
	if errors.Is(err, errTailTaken) {
		return 0, nil
	}
	return freed, err
}

// cutTail takes the region's free tail from keep to old out of the arena
// and the holes, and its committed bytes out of what is held, under the
// arena's, the holes' and the segments' locks; errTailTaken when the tail
// changed since freeTail.
func (p *Pool) cutTail(keep, old uint64) (uint64, error) {
	a, h, g := &p.arena, &p.holes, &p.segs
	p.lockRegionLevels()
	defer p.unlockRegionLevels()
	rs := g.rseg
	if rs == nil {
		return 0, errTailTaken // Close came meanwhile; the region's release has the range
	}
	t := rs.tail()
	if !t.free || t.addr > rs.base+keep || rs.size != old {
		return 0, errTailTaken
	}
	a.remove(t)
	if cut := rs.base + keep - t.addr; cut > 0 {
		t.size = cut
		a.insert(t)
	} else if t.prev != nil {
		t.prev.next = nil
	} else {
		t.size = 0 // the head of an empty region
	}
	// The decommitted granules of the cut are not held already.
	gran := h.gran
	var decommitted uint64
	for k := keep / gran; k < old/gran; k++ {
		if h.set.has(k) {
			h.set.del(k)
			decommitted += gran
		}
	}
	freed := old - keep - decommitted
	rs.size = keep
	g.held -= freed
	g.frees++
	return freed, nil
}

// freeTail returns the region, the length it would keep once the last
// granules of its free tail holding wanted committed bytes are cut (at
// least the start of the free tail, rounded up to the granularity) and its
// length now; ok is false when there is no free tail to give.
func (p *Pool) freeTail(wanted uint64) (r *pmm.Region, keep, old uint64, ok bool) {
	h, g := &p.holes, &p.segs
	p.lockRegionLevels()
	defer p.unlockRegionLevels()
	if p.closed.Load() || g.rseg == nil {
		return nil, 0, 0, false
	}
	t := g.rseg.tail()
	if !t.free {
		return nil, 0, 0, false
	}
	gran := h.gran
	least := (t.addr - g.rseg.base + gran - 1) / gran * gran
	old = g.rseg.size
	if wanted >= old-least {
		return g.region, least, old, least < old
	}
	keep = old
	for got := uint64(0); keep > least && got < wanted; {
		keep -= gran
		if !h.set.has(keep / gran) {
			got += gran
		}
	}
	return g.region, keep, old, keep < old
}

var errTailTaken = errors.New("pool: the free tail was taken meanwhile")

// tail returns the segment's last chunk.
func (s *segment) tail() *chunk {
	c := s.head
	for c.next != nil {
		c = c.next
	}
	return c
}
