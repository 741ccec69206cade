package pool

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// segment is one piece of backing: a pmm Buffer of the pool's binding, or
// the pool's one Region (BackingRegion), whose size is its committed
// length.
type segment struct {
	buf  *pmm.Buffer
	reg  *pmm.Region
	base uint64
	size uint64
	head *chunk // first chunk in address order
	last *chunk // last chunk in address order
	huge bool   // one block at a time, never in the arena (huge.go)
}

// chunk is a contiguous piece of a segment: free, a slab, or a large block.
// The chunks of a segment tile it in address order (prev/next), so freeing
// one coalesces with free neighbours (best-fit with coalescing, BFC-style).
type chunk struct {
	seg        *segment
	addr, size uint64
	prev, next *chunk
	free       bool
	busy       bool // out of the arena while its granules are (de)committed (holes.go)
	slab       *slab
	blk        *block
}

// slab is a chunk carved into blocks of one size class.
type slab struct {
	ch    *chunk
	class int
	slots []block
}

// arena is the best-fit index of the free chunks of the pool's segments
// (not the huge ones), sorted by size then address: best fit, split on
// take, coalesced with both neighbours on free (BFC). The depot carves its
// slabs from its chunks and large blocks are its chunks (Go's mheap); when
// no chunk holds a request it grows from the segments level.
//
// Its lock, mu, guards free, busy and the counters, and every chunk of a
// segment that is not huge: its links (prev, next), its flags (free,
// busy) and its slab or block; and the region segment's size, which
// changes with this lock, the segments' held and growMu all held. It comes
// after the depot's lock and before the holes', the segments' and the
// shards' locks.
type arena struct {
	mu            sync.Mutex
	free          []*chunk
	busy          uint64 // bytes of chunks out of the index while their granules are (de)committed (holes.go)
	splits        uint64
	merges        uint64
	allocs, frees uint64 // large blocks handed out and freed here
	// growers are the growths waiting for the segments level (grower).
	growers []*grower

	p      *Pool // the blocks' pool, its options and closed flag
	depot  *depot
	holes  *holes
	segs   *segments
	shards *shards
}

// growth is how the arena must grow for a request that no free chunk
// holds: by need bytes past the region's free tail, the region being size
// bytes long when that was seen (BackingSegments: a segment of need bytes).
// want is the chunk the request takes.
type growth struct{ need, size, want uint64 }

// grower is a growth waiting for the segments level (the governor's room,
// then the mechanism). A chunk of at least want bytes freed into the arena
// meanwhile (a block freed, another growth's segment) cancels its wait
// with errTakeAgain: the request takes that chunk instead of waiting for
// other holders' refunds, which a pool whose own blocks come back may
// never see.
type grower struct {
	want   uint64
	cancel context.CancelCauseFunc
}

// errTakeAgain is the cause of a growth's wait ended by a chunk that fits.
var errTakeAgain = errors.New("pool: a chunk that fits was freed while the growth waited")

// endGrowth unregisters gw, whose growth ended, and releases its context.
func (a *arena) endGrowth(gw *grower) {
	a.mu.Lock()
	if i := slices.Index(a.growers, gw); i >= 0 {
		a.growers = slices.Delete(a.growers, i, i+1)
	}
	a.mu.Unlock()
	gw.cancel(nil)
}

// tookAgain reports whether err ended a growth whose wait a fitting chunk
// cut short (errTakeAgain) while the caller's ctx still runs.
func tookAgain(ctx, wctx context.Context) bool {
	return ctx.Err() == nil && errors.Is(context.Cause(wctx), errTakeAgain)
}

// alloc serves a large request: a best-fit chunk of r bytes (n asked). When
// none fits it has the depot give its wholly free slabs back first (once),
// then grows from the segments level, holding no lock meanwhile; a chunk
// that covers decommitted granules has them committed again first
// (holes.recommit).
func (a *arena) alloc(ctx context.Context, r, n uint64, s memapi.Stream) (Block, error) {
	var committed *chunk
	compacted := false
	for {
		h, busy, miss, err := a.takeLarge(r, n, s, committed)
		committed = nil
		switch {
		case err != nil || h.b != nil:
			return h, err
		case busy != nil:
			if err := a.holes.recommit(ctx, n, busy); err != nil {
				return Block{}, err
			}
			committed = busy
		case !compacted && a.depot.live.Load() > 0:
			a.depot.compact()
			compacted = true
		default:
			if err := a.grow(ctx, n, miss); err != nil {
				return Block{}, err
			}
		}
	}
}

// takeLarge hands out a best-fit chunk of r bytes (n asked) as a large
// block, or the chunk committed, one whose granules holes.recommit just
// committed again. A chunk that covers decommitted granules is returned
// busy instead, to be committed outside every lock; when none fits, miss
// says how the arena must grow.
func (a *arena) takeLarge(r, n uint64, s memapi.Stream, committed *chunk) (h Block, busy *chunk, miss growth, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.p.closed.Load() {
		return Block{}, nil, miss, errClosed()
	}
	ch := committed
	if ch != nil {
		a.unbusy(ch)
	} else {
		var isBusy bool
		ch, isBusy, miss = a.take(r)
		switch {
		case ch == nil:
			return Block{}, nil, miss, nil
		case isBusy:
			return Block{}, ch, miss, nil
		}
	}
	b := &block{p: a.p, addr: ch.addr, size: r, req: n, stream: s, ch: ch} // Open in generation 0 (block.go)
	ch.blk = b
	a.allocs++
	a.shards.count(r, n)
	return Block{b: b}, nil, miss, nil
}

// takeSlab takes a chunk of size bytes for a slab (take), under mu; the
// caller holds the depot's lock.
func (a *arena) takeSlab(size uint64) (ch *chunk, busy bool, miss growth) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.take(size)
}

// take takes n bytes from the free chunks: best fit, or, while the region
// has decommitted granules, among the few smallest chunks that fit the
// first whose start (or end) needs no commit. Blocks then pack into
// committed granules and leave whole free ones together, which the next
// decommit gives back. A chunk that still covers decommitted granules is
// marked busy (out of reach until committed, holes.go). When no chunk
// holds n, take returns nil and how the arena must grow. The caller holds
// mu; take takes the holes' lock.
func (a *arena) take(n uint64) (ch *chunk, busy bool, miss growth) {
	i := a.search(n, 0)
	if i == len(a.free) {
		miss.need, miss.want = n, n
		if rs := a.segs.rseg; rs != nil {
			miss.size = rs.size
			if t := rs.last; t.free {
				miss.need -= t.size
			}
		}
		return nil, false, miss
	}
	h := a.holes
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.set.n == 0 {
		return a.takeAt(i, n, false), false, miss
	}
	for k := i; k < len(a.free) && k < i+committedFitScan && ch == nil; k++ {
		c := a.free[k]
		if c.seg.reg == nil {
			continue
		}
		if lo, hi := h.granules(c.addr, n, false); !h.set.any(lo, hi) {
			ch = a.takeAt(k, n, false)
		} else if lo, hi := h.granules(c.addr+c.size-n, n, false); !h.set.any(lo, hi) {
			ch = a.takeAt(k, n, true)
		}
	}
	if ch == nil {
		ch = a.takeAt(i, n, false)
	}
	if h.covers(ch) {
		a.markBusy(ch)
		return ch, true, miss
	}
	return ch, false, miss
}

// committedFitScan bounds how many chunks take looks at.
const committedFitScan = 16

// search returns the index of the first free chunk at or after (size,
// addr) in the index's order: search(n, 0) is the smallest chunk of at
// least n bytes (len(free) if none).
func (a *arena) search(size, addr uint64) int {
	lo, hi := 0, len(a.free)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if c := a.free[m]; c.size < size || c.size == size && c.addr < addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// takeAt takes n bytes of the free chunk at index i, split so that the
// chunk returned is exactly n: its first n bytes, or its last n when
// fromEnd (the rest stays free).
func (a *arena) takeAt(i int, n uint64, fromEnd bool) *chunk {
	c := a.free[i]
	a.free = slices.Delete(a.free, i, i+1)
	c.free = false
	if c.size == n {
		return c
	}
	a.splits++
	if fromEnd {
		blk := &chunk{seg: c.seg, addr: c.addr + c.size - n, size: n, prev: c, next: c.next}
		if c.next != nil {
			c.next.prev = blk
		} else {
			c.seg.last = blk
		}
		c.next, c.size = blk, c.size-n
		a.insert(c)
		return blk
	}
	rest := &chunk{seg: c.seg, addr: c.addr + n, size: c.size - n, prev: c, next: c.next}
	if c.next != nil {
		c.next.prev = rest
	} else {
		c.seg.last = rest
	}
	c.next, c.size = rest, n
	a.insert(rest)
	return c
}

func (a *arena) insert(c *chunk) {
	c.free = true
	a.free = slices.Insert(a.free, a.search(c.size, c.addr), c)
	for _, gw := range a.growers {
		if c.size >= gw.want {
			gw.cancel(errTakeAgain)
		}
	}
}

func (a *arena) remove(c *chunk) {
	i := a.search(c.size, c.addr)
	if i == len(a.free) || a.free[i] != c {
		panic("pool: free chunk missing from the arena index")
	}
	a.free = slices.Delete(a.free, i, i+1)
	c.free = false
}

// give frees a chunk, coalescing it with free neighbours, and returns the
// free chunk it joined. The caller holds mu.
func (a *arena) give(c *chunk) *chunk {
	c.slab, c.blk = nil, nil
	if p := c.prev; p != nil && p.free {
		a.remove(p)
		p.size += c.size
		p.next = c.next
		if c.next != nil {
			c.next.prev = p
		} else {
			p.seg.last = p
		}
		c = p
		a.merges++
	}
	if n := c.next; n != nil && n.free {
		a.remove(n)
		c.size += n.size
		c.next = n.next
		if n.next != nil {
			n.next.prev = c
		} else {
			c.seg.last = c
		}
		a.merges++
	}
	a.insert(c)
	return c
}

// giveLocking is give under mu.
func (a *arena) giveLocking(c *chunk) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.give(c)
}

// freeLarge gives a large block's chunk back, coalesced.
func (a *arena) freeLarge(b *block) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.shards.uncount(b)
	a.frees++
	a.pay(a.give(b.ch))
}

// pay gives c's segment, which a free just coalesced into c, back to the
// governor when it is wholly free and the pool owes a waiting reservation
// bytes (debt.go), unless a growth of this pool that c fits waits (it
// takes c). The region is never given back here. A release that fails
// stays quarantined in released (Stats.Quarantined) and is retried and
// reported by the next Trim, Reclaim or Close. The caller holds mu.
func (a *arena) pay(c *chunk) {
	g := a.segs
	s := c.seg
	if s == g.rseg || !s.wholeFree() || a.p.closed.Load() {
		return
	}
	for _, gw := range a.growers {
		if c.size >= gw.want {
			return
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.settle(s.size) {
		return
	}
	a.remove(c)
	_ = g.drop(s)
}

// markBusy takes ch out of reach while a pmm call commits or decommits its
// granules: no taker gets it and no freed neighbour coalesces into it.
func (a *arena) markBusy(ch *chunk) {
	ch.busy = true
	a.busy += ch.size
}

func (a *arena) unbusy(ch *chunk) {
	ch.busy = false
	a.busy -= ch.size
}

// taken ends a busy chunk's commit (holes.recommit): it is the caller's
// now, to carve into a slab. The caller holds the depot's lock, so the
// chunk goes from busy to its slab unseen.
func (a *arena) taken(ch *chunk) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.p.closed.Load() {
		return errClosed()
	}
	a.unbusy(ch)
	return nil
}

// grow refills the arena from the segments level, holding no level's lock
// while the binding allocates (the governor may ask this very pool to
// Reclaim): BackingSegments, a new segment of at least SegmentBytes;
// BackingRegion, the region grown at its end past its free tail by at
// least SegmentBytes (under growMu, which serializes the region's pmm
// calls), the new range joining the arena, coalesced with the free tail,
// only once Grow committed it, so a rollback has nothing to take back.
// It returns nil without growing when a chunk of miss.want bytes is free
// in the arena as it starts (freed since the miss) or is freed into it
// while it waits (grower): the caller takes again.
func (a *arena) grow(ctx context.Context, wanted uint64, miss growth) error {
	g := a.segs
	rs := g.rseg
	// The growth waits as a grower: a chunk that fits, inserted before it
	// ends, cuts its wait short (errTakeAgain), and one in the index now
	// (freed since the miss was seen) means no growth at all.
	a.mu.Lock()
	if a.search(miss.want, 0) < len(a.free) {
		a.mu.Unlock()
		return nil // take again
	}
	wctx, cancel := context.WithCancelCause(ctx)
	gw := &grower{want: miss.want, cancel: cancel}
	a.growers = append(a.growers, gw)
	a.mu.Unlock()
	defer a.endGrowth(gw)
	if rs == nil {
		seg, err := g.allocate(wctx, wanted, max(miss.need, uint64(a.p.opts.SegmentBytes)), false)
		if err != nil {
			if tookAgain(ctx, wctx) {
				return nil
			}
			return err
		}
		return a.addSegment(seg)
	}
	g.growMu.Lock()
	defer g.growMu.Unlock()
	if a.p.closed.Load() {
		return errClosed()
	}
	if rs.size != miss.size {
		return nil // another growth (or a trim) came first: take again
	}
	if a.holes.slack > 0 {
		// Before the region grows, the whole free granules inside it go
		// back (holes.go): the peak held is then what the blocks cover, not
		// the holes between them. A decommit that fails changes nothing here.
		a.holes.relieve(ctx)
	}
	newLen := (miss.size + max(miss.need, uint64(a.p.opts.SegmentBytes)) + g.gran - 1) / g.gran * g.gran
	if err := g.growRegion(wctx, wanted, miss.size, newLen); err != nil {
		if tookAgain(ctx, wctx) {
			return nil
		}
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if a.p.closed.Load() {
		return errClosed() // Close came meanwhile; the region's release has the range
	}
	add := newLen - rs.size
	g.allocs++
	switch t := rs.last; {
	case t.free: // the free tail takes the new range
		a.remove(t)
		t.size += add
		a.insert(t)
		a.merges++
	case rs.size == 0: // the head of an empty region
		t.size = add
		a.insert(t)
	default:
		c := &chunk{seg: rs, addr: rs.base + rs.size, size: add, prev: t}
		t.next, rs.last = c, c
		a.insert(c)
	}
	rs.size = newLen
	g.held += add
	g.peak = max(g.peak, g.held)
	return nil
}

// addSegment books a new segment (BackingSegments) and makes it one free
// chunk; when the pool closed meanwhile, its Buffer is closed, kept until
// pmm released it (segments.closeKept).
func (a *arena) addSegment(seg *segment) error {
	g := a.segs
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if a.p.closed.Load() {
		return errors.Join(errClosed(), g.closeKept(seg.buf))
	}
	g.book(seg)
	seg.head = &chunk{seg: seg, addr: seg.base, size: seg.size}
	seg.last = seg.head
	a.insert(seg.head)
	return nil
}

// giveBack gives the wholly free segments (BackingSegments' segments, the
// huge segments in either backing) to the segments level, which closes
// them: largest first, the fewest releases for the bytes asked, until
// wanted bytes. closed: the pool is closed.
func (a *arena) giveBack(wanted uint64) (freed uint64, err error, closed bool) {
	g := a.segs
	a.mu.Lock()
	defer a.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if a.p.closed.Load() {
		return 0, nil, true
	}
	var segs []*segment
	var errs []error
	for s := range g.all {
		if s.wholeFree() {
			segs = append(segs, s)
		}
	}
	slices.SortFunc(segs, func(x, y *segment) int {
		if x.size != y.size {
			return cmp.Compare(y.size, x.size)
		}
		return cmp.Compare(x.base, y.base)
	})
	for _, s := range segs {
		if freed >= wanted {
			break
		}
		if s.huge {
			i := slices.Index(g.huge, s.head)
			g.huge = slices.Delete(g.huge, i, i+1)
		} else {
			a.remove(s.head)
		}
		freed += s.size
		errs = append(errs, g.drop(s))
	}
	return freed, errors.Join(errs...), false
}

// wholeFree reports whether the segment is one free chunk.
func (s *segment) wholeFree() bool { return s.head.free && s.head.next == nil && s.head.size == s.size }

func (a *arena) freeBytes() (n uint64) {
	for _, c := range a.free {
		n += c.size
	}
	return n
}
