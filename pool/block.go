package pool

import (
	"sync/atomic"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// Block is an owning handle of pool memory: a value (it costs no heap
// allocation) naming a block and the generation it was handed out in.
// Record the fences of device work that used it, then Free it once.
//
// A block's life is the common one (ep.State): Open while in use; Pending
// once freed with fences that have not completed (reusable at once on its
// own stream, on others only once they complete); Released once back in the
// cache. Returning a block to the cache cannot fail, so a block is never
// Quarantined (that belongs to the segments, which are pmm Buffers with
// pmm's lifecycle), and Closing only while a Free takes it (claim).
//
// One block's methods are not for concurrent use with each other, except
// that two racing Frees are told apart (one gets ErrDoubleFree) and that a
// stale handle (its block freed, perhaps handed out again) never touches
// the block's state: only the Free that wins the block's state word
// (claim), or the pool under its lock, reads the block's fields.
type Block struct {
	b   *block
	gen uint32
}

// block is the pool's record of one block, reused across generations.
type block struct {
	p       *Pool
	next    *block // free-list link
	addr    uint64
	size    uint64 // class size, or the rounded large size
	req     uint64 // bytes asked for while in use
	word    atomic.Uint64
	stream  memapi.Stream
	fences  []memapi.Fence
	foreign bool   // a fence from another stream: no reuse before it completes
	slab    *slab  // small blocks
	ch      *chunk // large blocks
}

func pack(gen uint32, st ep.State) uint64 { return uint64(gen)<<8 | uint64(st) }

// fenced is set in the word of an Open block once a fence was recorded on
// it in this generation (RecordUse). A Free of a small block without it has
// no fences to look at: one compare-and-swap ends its generation (Pool.Free).
const fenced = 0x80

// A new block record's zero word is pack(0, ep.Open): a large or huge
// block made for an Alloc is handed out Open in generation 0 as it is
// made. (This fails to compile if ep.Open is not 0.)
var _ [0]struct{} = [ep.Open]struct{}{}

func (b *block) unpack() (uint32, ep.State) {
	w := b.word.Load()
	return uint32(w >> 8), ep.State(w & (fenced - 1))
}

// open hands a free small block out in its current generation. A free
// small block waits Open in the generation it will be handed out in (Free
// and the depot's sweep store it so, a new slab's blocks are zero words):
// no handle of that generation exists before open returns one, so a stale
// handle's Free, RecordUse or State sees another generation, and open
// needs no store of its own, one atomic write less on the fast path. Only
// a pending block reused on its own stream is opened from Pending.
func (b *block) open(req uint64, s memapi.Stream) Block {
	gen, st := b.unpack()
	b.req, b.stream = req, s
	if st != ep.Open {
		b.word.Store(pack(gen, ep.Open))
	}
	return Block{b: b, gen: gen}
}

// claim makes the caller the owner of the block's generation gen for a
// Free: the compare-and-swap from Open to Closing succeeds for one caller
// only, and only while gen is the block's generation. Every field of the
// block is read by a Free after its claim, never before, so a losing or
// stale Free reads nothing its winner or the block's next owner writes.
// The winner ends the claim by storing gen+1 with the block's next state.
func (b *block) claim(gen uint32) bool {
	w := b.word.Load()
	return w&^fenced == pack(gen, ep.Open) && b.word.CompareAndSwap(w, pack(gen, ep.Closing))
}

// Addr returns the block's device address, a multiple of Alignment.
func (h Block) Addr() memapi.DeviceAddr { return memapi.DeviceAddr(h.b.addr) }

// Size returns the bytes asked for.
func (h Block) Size() memapi.Bytes { return memapi.Bytes(h.b.req) }

// Rounded returns the bytes the block occupies (its size class, or the
// large size rounded to Alignment): what Stats counts in use.
func (h Block) Rounded() memapi.Bytes { return memapi.Bytes(h.b.size) }

// State returns where the handle is in its life. A handle whose block was
// handed out again reports ep.Released.
func (h Block) State() ep.State {
	if h.b == nil {
		return ep.Released
	}
	gen, st := h.b.unpack()
	switch {
	case gen == h.gen:
		return st // Open
	case gen == h.gen+1 && st == ep.Pending:
		return ep.Pending // freed behind fences, not handed out again
	}
	return ep.Released
}

// RecordUse records a fence of device work on the block's own stream (the
// one given to Alloc): after Free the block is reusable at once on that
// stream, on others once f completes.
func (h Block) RecordUse(f memapi.Fence) error { return h.record(f, false) }

// RecordStreamUse records a fence of work on another stream: after Free the
// block is reused on no stream before f completes (the caching allocator's
// record_stream).
func (h Block) RecordStreamUse(f memapi.Fence) error { return h.record(f, true) }

func (h Block) record(f memapi.Fence, foreign bool) error {
	if h.b == nil {
		return &memapi.Error{Op: "pool.Block.RecordUse", Kind: ErrForeignBlock, Detail: "zero Block"}
	}
	if f == nil {
		return &memapi.Error{Op: "pool.Block.RecordUse", Kind: memapi.ErrNilHandle, Detail: "nil fence"}
	}
	for {
		w := h.b.word.Load()
		if w&^fenced != pack(h.gen, ep.Open) {
			return &memapi.Error{Op: "pool.Block.RecordUse", Kind: memapi.ErrReleased, Detail: "block freed"}
		}
		if w&fenced != 0 || h.b.word.CompareAndSwap(w, w|fenced) {
			break
		}
	}
	h.b.fences = append(h.b.fences, f)
	h.b.foreign = h.b.foreign || foreign
	return nil
}

// Free returns the block to its pool (Pool.Free).
func (h Block) Free() error {
	if h.b == nil {
		return &memapi.Error{Op: "pool.Free", Kind: ErrForeignBlock, Detail: "zero Block"}
	}
	return h.b.p.Free(h)
}

// done reports whether every fence recorded on b completed.
func (b *block) done() bool {
	for _, f := range b.fences {
		if !f.Done() {
			return false
		}
	}
	return true
}

// reset forgets the fences of a block whose last use completed.
func (b *block) reset() {
	clear(b.fences)
	b.fences = b.fences[:0]
	b.foreign = false
	b.stream = nil
}

// freeList is an intrusive LIFO of free blocks.
type freeList struct {
	head *block
	n    int
}

func (l *freeList) push(b *block) { b.next, l.head = l.head, b; l.n++ }

func (l *freeList) pop() *block {
	b := l.head
	if b != nil {
		l.head, b.next = b.next, nil
		l.n--
	}
	return b
}
