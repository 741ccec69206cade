package pool

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
)

// BackingRegion is one stable growable pmm Region per pool (expandable
// segments), reserved when the pool is made (New): growth commits at the
// end (arena.grow), trimming decommits the free tail, and whole free
// granules inside it are decommitted and committed again in place
// (holes.go). Addresses never move. The pool's arena is then one segment
// whose size is the region's committed length. Reserving costs address
// space only (no budget), so a pool that never allocates holds no bytes;
// the reservation is given back by Close.
const BackingRegion Backing = "region"

// lockRegion takes the arena's, the holes' and the segments' locks, in
// order (depot.go): the region's paths that cut or fill its tail and holes
// change all three. unlockRegion lets them go.
func (a *arena) lockRegion() {
	a.mu.Lock()
	a.holes.mu.Lock()
	a.segs.mu.Lock()
}

func (a *arena) unlockRegion() {
	a.segs.mu.Unlock()
	a.holes.mu.Unlock()
	a.mu.Unlock()
}

// trimRegion decommits the region's free tail (rounded to the granularity)
// once wanted is more than 0, then, while that was fewer than wanted, the
// whole free granules inside the region (holes.go). It never waits for a
// growth or a recommit in flight (the growth may be the reservation that
// asked): it gives 0 then.
func (a *arena) trimRegion(ctx context.Context, wanted uint64) (uint64, error) {
	if wanted == 0 || !a.segs.growMu.TryLock() {
		return 0, nil
	}
	defer a.segs.growMu.Unlock()
	freed, err := a.trimTail(ctx, wanted)
	if freed >= wanted || err != nil {
		return freed, err
	}
	n, err := a.holes.decommit(ctx, wanted-freed)
	return freed + n, err
}

// trimTail shrinks the region by its free tail's last granules, as many as
// hold wanted committed bytes (math.MaxUint64: to the start of the free
// tail), so that a ticket for a little gets about that little and the next
// growth does not have to commit back what nobody asked for. The caller
// holds growMu.
func (a *arena) trimTail(ctx context.Context, wanted uint64) (uint64, error) {
	keep, old, ok := a.freeTail(wanted)
	if !ok {
		return 0, nil
	}
	var freed uint64
	err := a.segs.region.Shrink(ctx, memapi.Bytes(keep), func(memapi.Bytes) error {
		var err error
		freed, err = a.cutTail(keep, old)
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
func (a *arena) cutTail(keep, old uint64) (uint64, error) {
	h, g := a.holes, a.segs
	a.lockRegion()
	defer a.unlockRegion()
	rs := g.rseg
	if a.p.closed.Load() {
		return 0, errTailTaken // Close came meanwhile; the region's release has the range
	}
	t := rs.last
	if !t.free || t.addr > rs.base+keep || rs.size != old {
		return 0, errTailTaken
	}
	a.remove(t)
	if cut := rs.base + keep - t.addr; cut > 0 {
		t.size = cut
		a.insert(t)
	} else if t.prev != nil {
		t.prev.next = nil
		rs.last = t.prev
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

// freeTail returns the length the region would keep once the last
// granules of its free tail holding wanted committed bytes are cut (at
// least the start of the free tail, rounded up to the granularity) and its
// length now; ok is false when there is no free tail to give.
func (a *arena) freeTail(wanted uint64) (keep, old uint64, ok bool) {
	h, g := a.holes, a.segs
	a.lockRegion()
	defer a.unlockRegion()
	if a.p.closed.Load() {
		return 0, 0, false
	}
	t := g.rseg.last
	if !t.free {
		return 0, 0, false
	}
	gran := h.gran
	least := (t.addr - g.rseg.base + gran - 1) / gran * gran
	old = g.rseg.size
	if wanted >= old-least {
		return least, old, least < old
	}
	keep = old
	for got := uint64(0); keep > least && got < wanted; {
		keep -= gran
		if !h.set.has(keep / gran) {
			got += gran
		}
	}
	return keep, old, keep < old
}

var errTailTaken = errors.New("pool: the free tail was taken meanwhile")
