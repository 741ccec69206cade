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
	if p.region == nil {
		r, err := p.bind.ReserveVirtual(ctx, p.opts.RegionBytes)
		if err != nil {
			return err
		}
		if err := p.adoptRegion(r); err != nil {
			return err
		}
	}
	r := p.region
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
	trimmed0 := p.reclaimedNow()
	wctx, cancel := context.WithTimeout(ctx, p.opts.Wait)
	err = r.Grow(wctx, memapi.Bytes(newLen), func(memapi.Bytes) error { return nil })
	waited := wctx.Err() != nil && ctx.Err() == nil
	cancel()
	if err != nil {
		return p.growFailed(wanted, newLen-old, err, waited, trimmed0)
	}
	got := uint64(r.Len())
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rseg == nil {
		return errClosed() // Close came meanwhile; the region's release has the range
	}
	p.extendLocked(got)
	p.c.segAllocs++
	return nil
}

// adoptRegion makes r the pool's region; when the pool closed meanwhile,
// it closes r, kept as the closed pool's region (closeKeptLocked).
func (p *Pool) adoptRegion(r *pmm.Region) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return errors.Join(errClosed(), p.closeKeptLocked(r))
	}
	p.region = r
	p.rseg = &segment{reg: r, base: uint64(r.Addr())}
	p.rseg.head = &chunk{seg: p.rseg, addr: p.rseg.base}
	return nil
}

// regionTail returns the bytes free at the region's end and its length.
func (p *Pool) regionTail() (free, size uint64, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() || p.rseg == nil {
		return 0, 0, errClosed()
	}
	if t := p.rseg.tail(); t.free {
		free = t.size
	}
	return free, p.rseg.size, nil
}

// extendLocked makes the region's arena segment size bytes long, the new
// range one free chunk (coalesced with a free tail).
func (p *Pool) extendLocked(size uint64) {
	s := p.rseg
	add := size - s.size
	if add == 0 {
		return
	}
	if s.size == 0 {
		s.head.size = add
		p.arena.insert(s.head)
	} else {
		t := s.tail()
		c := &chunk{seg: s, addr: s.base + s.size, size: add, prev: t}
		t.next = c
		p.arena.give(c)
	}
	s.size = size
	p.held += add
	p.peak = max(p.peak, p.held)
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
	//memvet:allow a borrowed reference to the pool's own region, which Close closes (closeLocked) and release.go retries
	r, keep, old, ok := p.freeTail(wanted)
	if !ok {
		return 0, nil
	}
	var freed uint64
	err := r.Shrink(ctx, memapi.Bytes(keep), func(memapi.Bytes) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.rseg == nil {
			return errTailTaken // Close came meanwhile; the region's release has the range
		}
		t := p.rseg.tail()
		if !t.free || t.addr > p.rseg.base+keep || p.rseg.size != old {
			return errTailTaken
		}
		p.arena.remove(t)
		if cut := p.rseg.base + keep - t.addr; cut > 0 {
			t.size = cut
			p.arena.insert(t)
		} else if t.prev != nil {
			t.prev.next = nil
		} else {
			t.size = 0 // the head of an empty region
		}
		// The decommitted granules of the cut are not held already.
		g := uint64(r.Granularity())
		var holes uint64
		for k := keep / g; k < old/g; k++ {
			if p.holes.has(k) {
				p.holes.del(k)
				holes += g
			}
		}
		freed = old - keep - holes
		p.rseg.size = keep
		p.held -= freed
		p.c.segFrees++
		return nil
	})
	if errors.Is(err, errTailTaken) {
		return 0, nil
	}
	return freed, err
}

// freeTail returns the region, the length it would keep once the last
// granules of its free tail holding wanted committed bytes are cut (at
// least the start of the free tail, rounded up to the granularity) and its
// length now; ok is false when there is no free tail to give.
func (p *Pool) freeTail(wanted uint64) (r *pmm.Region, keep, old uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() || p.rseg == nil {
		return nil, 0, 0, false
	}
	t := p.rseg.tail()
	if !t.free {
		return nil, 0, 0, false
	}
	gran := uint64(p.region.Granularity())
	least := (t.addr - p.rseg.base + gran - 1) / gran * gran
	old = p.rseg.size
	if wanted >= old-least {
		return p.region, least, old, least < old
	}
	keep = old
	for got := uint64(0); keep > least && got < wanted; {
		keep -= gran
		if !p.holes.has(keep / gran) {
			got += gran
		}
	}
	return p.region, keep, old, keep < old
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
