package pool

import (
	"cmp"
	"slices"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// segment is one piece of backing: a pmm Buffer of the pool's binding, or
// the pool's one Region (BackingRegion), whose size is its length.
type segment struct {
	buf  *pmm.Buffer
	reg  *pmm.Region
	base uint64
	size uint64
	head *chunk // first chunk in address order
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
// take, coalesced with both neighbours on free (BFC). Slabs are carved
// from its chunks and large blocks are its chunks (Go's mheap).
//
// Its lock, mu, guards free, busy and the counters, and every chunk of a
// segment that is not huge: its links (prev, next), its flags (free,
// busy) and its slab or block; and the region segment's size, which
// changes with both this lock and the segments' held. It comes after the
// depot's lock and before the holes', the segments' and the shards' locks.
type arena struct {
	mu     sync.Mutex
	free   []*chunk
	busy   uint64 // bytes of chunks out of the index while their granules are (de)committed (holes.go)
	splits uint64
	merges uint64
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

func cmpChunk(x, y *chunk) int {
	if c := cmp.Compare(x.size, y.size); c != 0 {
		return c
	}
	return cmp.Compare(x.addr, y.addr)
}

func (a *arena) insert(c *chunk) {
	c.free = true
	i, _ := slices.BinarySearchFunc(a.free, c, cmpChunk)
	a.free = slices.Insert(a.free, i, c)
}

func (a *arena) remove(c *chunk) {
	i, ok := slices.BinarySearchFunc(a.free, c, cmpChunk)
	if !ok {
		panic("pool: free chunk missing from the arena index")
	}
	a.free = slices.Delete(a.free, i, i+1)
	c.free = false
}

// fit returns the index of the smallest free chunk of at least n bytes
// (len(a.free) if none).
func (a *arena) fit(n uint64) int {
	i, _ := slices.BinarySearchFunc(a.free, &chunk{size: n}, cmpChunk)
	return i
}

// takeAt takes n bytes of the free chunk at index i, split so that the
// chunk returned is exactly n: its first n bytes, or its last n when
// fromEnd (the rest stays free). Best fit is takeAt(fit(n), n, false)
// (arena.take).
func (a *arena) takeAt(i int, n uint64, fromEnd bool) *chunk {
	c := a.free[i]
	a.free = slices.Delete(a.free, i, i+1)
	c.free = false
	if fromEnd && c.size > n {
		blk := &chunk{seg: c.seg, addr: c.addr + c.size - n, size: n, prev: c, next: c.next}
		if c.next != nil {
			c.next.prev = blk
		}
		c.next, c.size = blk, c.size-n
		a.insert(c)
		a.splits++
		return blk
	}
	if c.size > n {
		rest := &chunk{seg: c.seg, addr: c.addr + n, size: c.size - n, prev: c, next: c.next}
		if c.next != nil {
			c.next.prev = rest
		}
		c.next, c.size = rest, n
		a.insert(rest)
		a.splits++
	}
	return c
}

// give frees a chunk, coalescing it with free neighbours.
func (a *arena) give(c *chunk) {
	c.slab, c.blk = nil, nil
	if p := c.prev; p != nil && p.free {
		a.remove(p)
		p.size += c.size
		p.next = c.next
		if c.next != nil {
			c.next.prev = p
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
		}
		a.merges++
	}
	a.insert(c)
}

// add makes a new segment one free chunk.
func (a *arena) add(s *segment) {
	s.head = &chunk{seg: s, addr: s.base, size: s.size}
	a.insert(s.head)
}

// wholeFree reports whether the segment is one free chunk.
func (s *segment) wholeFree() bool { return s.head.free && s.head.next == nil && s.head.size == s.size }

func (a *arena) freeBytes() (n uint64) {
	for _, c := range a.free {
		n += c.size
	}
	return n
}

// owned is the segment's pmm handle.
func (s *segment) owned() interface {
	RecordUse(memapi.Fence) error
	Close() error
} {
	if s.reg != nil {
		return s.reg
	}
	return s.buf
}
