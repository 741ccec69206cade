package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
)

// DefaultWait is how long an allocation waits for the governor by default
// when the binding's capacity is short: long enough for pending frees
// (another session's released blocks waiting in the deferred-free queue)
// and holders answering pressure tickets, short enough that a session over
// budget fails promptly.
const DefaultWait = 100 * time.Millisecond

// Options configure an Allocator.
type Options struct {
	// Wait bounds how long one allocation waits for the governor when
	// capacity is short (the pool's growth, or a Reserve). 0 means
	// DefaultWait; a negative value means no wait: a Reserve is answered
	// from what is free now, and the pool's growth runs under 1 ms (the
	// pool bounds its whole growth, region transaction included, by its
	// Wait, and a growth under a context already done would never start).
	Wait time.Duration
	// OnError, when set, is called (from ONNX Runtime's thread) with every
	// refused allocation and every failed Free. A refused allocation
	// reaches ONNX Runtime as an exception it turns into its error status;
	// a failed Free leaves the block charged.
	OnError func(err error)
	// Pool configures the pool Alloc draws from (pool.Options; its Wait
	// is set from Wait above).
	Pool pool.Options
	// FrontBytes bounds the bytes of the front cache (front.go): freed
	// pool blocks of up to pool.SmallMax kept in C, so that ONNX Runtime's
	// next Alloc of their class is served without a call into Go. 0 means
	// DefaultFrontBytes; a negative value turns the front off.
	FrontBytes int64
	// FrontDepth bounds the blocks the front keeps per size class. 0 means
	// DefaultFrontDepth; it is clamped to 1..4096.
	FrontDepth int
}

// Stats count an Allocator's calls, as ONNX Runtime made them: a block in
// the front cache is free (not Live), and a drain of the front is no Free.
type Stats struct {
	Allocs        uint64       // successful Alloc calls (pool blocks), front hits included
	Reserves      uint64       // successful Reserve calls (whole buffers of the binding)
	Frees         uint64       // successful Free calls, those the front kept included
	Refused       uint64       // Alloc and Reserve calls refused (over budget, bad size, or the mechanism failed)
	FreeErrors    uint64       // Free calls that failed (unknown pointer or release error)
	Live          int          // blocks ONNX Runtime holds now
	LiveBytes     memapi.Bytes // their size: pool blocks rounded to their class, reserved buffers to the mechanism's granularity
	ReservedBytes memapi.Bytes // of LiveBytes, in reserved buffers
	PeakBytes     memapi.Bytes // the most LiveBytes has been since NewAllocator or ResetPeak
	MaxAllocSize  memapi.Bytes // the largest single request served
	// The front cache: Allocs it served without Go, Frees it kept
	// without Go, and the blocks and bytes it caches now (charged, counted
	// in use by the pool, but free: the governor sees them as cache).
	FrontHits, FrontKept uint64
	FrontBlocks          int
	FrontBytes           memapi.Bytes
	// FrontUntracked counts pool blocks the front could not track (its
	// map could not grow): their Free went to Go.
	FrontUntracked uint64
}

// Allocator is an OrtAllocator whose memory comes from a memgen binding:
// Alloc through a pool.Pool over the binding, Reserve from the binding
// itself. NewAllocator registers it with the ONNX Runtime environment;
// sessions created with SessionOptions then allocate through it. Only one
// allocator for CPU memory can be registered in the environment at a time.
//
// The pool and the front cache in front of it (front.go) keep freed blocks,
// charged to the binding's holder: register the Allocator as that holder
// with governor.HolderOptions{Cache: true}, so that pressure on the budget
// asks the caches first (Reclaim empties the front, then trims the pool).
type Allocator struct {
	id   uintptr
	bind *pmm.Binding
	pool *pool.Pool
	opts Options
	c    *C.memgen_ort_allocator
	live addrMap

	refused, freeErrors atomic.Uint64 // (allocs, reserves and frees are counted in live's shards, the front's in C)
	reservedBytes       atomic.Int64  // (live and peak bytes are counted by the front, in C, where every call passes)
	lastErr             atomic.Pointer[error]

	// drainMu orders the front's drains (Reclaim, Trim, Close): a drained
	// block is out of the front but not yet freed until its drain ends,
	// and Close must not count it as held by ONNX Runtime.
	drainMu  sync.Mutex
	frontMax int // the most blocks the front can cache (classes × depth)

	// observe, when set (with setObserve, before ONNX Runtime uses the
	// allocator), sees every request and free: op 'a' (Alloc), 'r'
	// (Reserve) or 'f' (Free), the address (0 for a refused request) and
	// the size asked. The tests record ONNX Runtime's allocation sequence
	// with it; the front is off while it is set, so that every call
	// reaches Go.
	observe func(op byte, addr, size uint64)

	mu     sync.Mutex
	closed bool
}

// NewAllocator makes an allocator over b (and its pool) and registers it
// with the ONNX Runtime environment loaded by Init. It fails when ONNX
// Runtime is not loaded, and with memapi.ErrInUse while another Allocator
// is registered (Unregister it first: its sessions keep using it).
func NewAllocator(b *pmm.Binding, opts Options) (*Allocator, error) {
	const op = "ort.NewAllocator"
	if b == nil {
		return nil, memapi.Errorf(op, memapi.ErrNilHandle, "no binding")
	}
	if opts.Wait == 0 {
		opts.Wait = DefaultWait
	}
	popts := opts.Pool
	popts.Wait = opts.Wait
	if opts.Wait < 0 {
		popts.Wait = time.Millisecond
	}
	p, err := pool.New(b, popts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	id, err := newID()
	if err != nil {
		return nil, errors.Join(err, p.Close())
	}
	a := &Allocator{id: id, bind: b, pool: p, opts: opts}
	classes := pool.Classes()
	ctab := make([]C.uint64_t, len(classes))
	for i, c := range classes {
		ctab[i] = C.uint64_t(c)
	}
	fb, depth := frontBounds(opts)
	if fb > 0 {
		a.frontMax = len(classes) * depth
	}
	var msg *C.char
	a.c = C.memgen_ort_new_allocator(C.uintptr_t(a.id), &ctab[0], C.int(len(ctab)), C.int64_t(fb), C.int(depth), &msg)
	if a.c == nil {
		return nil, errors.Join(cError(op, msg), p.Close())
	}
	publish(a.id, a)
	envAlloc.mu.Lock()
	defer envAlloc.mu.Unlock()
	if envAlloc.id != 0 {
		publish(a.id, nil)
		C.memgen_ort_front_release(&a.c.front)
		return nil, errors.Join(memapi.Errorf(op, memapi.ErrInUse,
			"another Allocator is registered with ONNX Runtime's environment; Unregister or Close it first"), p.Close())
	}
	if msg := C.memgen_ort_register(a.c); msg != nil {
		publish(a.id, nil)
		C.memgen_ort_front_release(&a.c.front)
		return nil, errors.Join(cError(op, msg), p.Close())
	}
	envAlloc.id = a.id
	return a, nil
}

// whileRegistered runs f while a is the allocator registered with ONNX
// Runtime's environment, so that a session f creates with
// session.use_env_allocators takes a and no other. It fails without
// calling f when a is closed (memapi.ErrClosed) or not registered
// (memapi.ErrForeignHandle: the session would take another allocator, or
// ONNX Runtime's own).
func (a *Allocator) whileRegistered(op string, f func() error) error {
	a.mu.Lock()
	closed := a.closed
	a.mu.Unlock()
	if closed {
		return memapi.Errorf(op, memapi.ErrClosed, "the workspace allocator was closed")
	}
	envAlloc.mu.Lock()
	defer envAlloc.mu.Unlock()
	if envAlloc.id != a.id {
		return memapi.Errorf(op, memapi.ErrForeignHandle, "the workspace allocator is not the one registered with ONNX Runtime's environment (Unregister was called)")
	}
	return f()
}

// envAlloc is the id of the Allocator registered with ONNX Runtime's
// environment now (0: none). ONNX Runtime 1.30 itself keeps one CPU
// allocator per device and lets a second RegisterAllocator replace the
// first silently, and its UnregisterAllocator removes whichever is
// registered for the device (both seen with this package's tests); so the
// one-at-a-time rule is kept here: NewAllocator fails while another is
// registered, and an Allocator unregisters only itself.
var envAlloc struct {
	mu sync.Mutex
	id uintptr
}

func cError(op string, msg *C.char) error {
	defer C.free(unsafe.Pointer(msg))
	return fmt.Errorf("%s: %s", op, C.GoString(msg))
}

// Binding returns the binding the allocator draws from.
func (a *Allocator) Binding() *pmm.Binding { return a.bind }

// Pool returns the pool Alloc draws from, for its Stats. The blocks the
// front caches are in use as the pool sees them; register the Allocator,
// not the pool, as the binding's holder.
func (a *Allocator) Pool() *pool.Pool { return a.pool }

// Stats returns the allocator's counters.
func (a *Allocator) Stats() Stats {
	c := a.live.counts()
	f := a.front()
	return Stats{
		Allocs:         c.allocs + uint64(f.hits),
		Reserves:       c.reserves,
		Frees:          c.frees + uint64(f.kept),
		Refused:        a.refused.Load(),
		FreeErrors:     a.freeErrors.Load(),
		Live:           int(f.live_blocks),
		LiveBytes:      memapi.Bytes(f.live_bytes),
		ReservedBytes:  memapi.Bytes(a.reservedBytes.Load()),
		PeakBytes:      memapi.Bytes(f.peak_bytes),
		MaxAllocSize:   memapi.Bytes(f.max_request),
		FrontHits:      uint64(f.hits),
		FrontKept:      uint64(f.kept),
		FrontBlocks:    int(f.cached_blocks),
		FrontBytes:     memapi.Bytes(f.cached_bytes),
		FrontUntracked: uint64(f.untracked),
	}
}

// ResetPeak restarts Stats.PeakBytes from the bytes held now.
func (a *Allocator) ResetPeak() { C.memgen_ort_front_reset_peak(&a.c.front) }

// LastError returns the error of the latest refused allocation or failed
// Free, nil when there was none: typically a *pool.OverBudgetError with
// the pool's figures, wrapping the governor's *governor.OverBudgetError,
// memapi.ErrOverBudget either way.
// (ONNX Runtime's status carries its message too.)
func (a *Allocator) LastError() error {
	if p := a.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (a *Allocator) fail(err error, counter *atomic.Uint64) {
	counter.Add(1)
	a.lastErr.Store(&err)
	if a.opts.OnError != nil {
		a.opts.OnError(err)
	}
}

// alloc serves OrtAllocator::Alloc from the pool: small requests from its
// size-class slabs, large ones best fit from its arena. Zero and absurd
// sizes are memapi.ErrInvalidSize (Refused, LastError, OnError) and change
// nothing; ONNX Runtime gets NULL for a zero-byte request, as
// OrtAllocator's contract says, and an exception for an absurd one. The pool's growth
// waits for the governor at most Options.Wait; the hot path (a cached
// block) allocates nothing on the heap. (A request the front cache serves
// never gets here.) It returns the address and the bytes held.
func (a *Allocator) alloc(size uint64) (uint64, int64, error) {
	blk, err := a.pool.Alloc(context.Background(), memapi.Bytes(size), nil)
	if err != nil {
		err = fmt.Errorf("ort.Allocator.Alloc of %d bytes: %w", size, err)
		a.fail(err, &a.refused)
		return 0, 0, err
	}
	addr := uint64(blk.Addr())
	h := held{blk: blk}
	a.live.put(addr, h)
	return addr, h.size(), nil
}

// reserve serves OrtAllocator::Reserve, which ONNX Runtime uses for memory
// that its own arena does not cache (BFCArena::Reserve allocates straight
// from the device allocator): a whole buffer of the binding, outside the
// pool, so that long-lived blocks (initializers) neither fragment the
// pool's arena nor sit in what its Reclaim can give back. The buffer is
// freed and refunded when ONNX Runtime frees the block.
func (a *Allocator) reserve(size uint64) (uint64, int64, error) {
	const op = "ort.Allocator.Reserve"
	if size == 0 || size > pool.MaxAlloc {
		err := &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(size), Detail: "0 or larger than pool.MaxAlloc"}
		a.fail(err, &a.refused)
		return 0, 0, err
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if a.opts.Wait > 0 {
		ctx, cancel = context.WithTimeout(context.Background(), a.opts.Wait)
	} else {
		ctx, cancel = context.WithCancel(context.Background())
		cancel() // no wait: the governor answers from what is free now
	}
	buf, err := a.bind.Allocate(ctx, memapi.Bytes(size))
	cancel()
	if err != nil {
		err = fmt.Errorf("%s of %d bytes: %w", op, size, err)
		a.fail(err, &a.refused)
		return 0, 0, err
	}
	addr := uint64(buf.Addr())
	a.reservedBytes.Add(int64(buf.Size()))
	h := held{buf: buf}
	a.live.put(addr, h)
	return addr, h.size(), nil
}

// free serves OrtAllocator::Free: the block is found from the address and
// returned to the pool (reusable at once), or the reserved buffer closed
// (released through the device context's deferred-free queue, the holder
// refunded after the free). An address this allocator did not hand out, or
// one freed already, is memapi.ErrForeignHandle and changes nothing. It
// returns the bytes freed (0 when nothing was). ortFree is false for a
// block the front cache gave back (a drain): not a Free of ONNX Runtime's.
func (a *Allocator) free(addr uint64, ortFree bool) int64 {
	const op = "ort.Allocator.Free"
	h, ok := a.live.take(addr, ortFree)
	if !ok {
		a.foreign(addr)
		return 0
	}
	size := h.size()
	var err error
	if h.buf != nil {
		err = h.buf.Close()
	} else {
		err = h.blk.Free()
	}
	if err != nil {
		a.live.unfree(addr, h, ortFree) // still held: a later Free may succeed
		a.fail(fmt.Errorf("%s of %#x: %w", op, addr, err), &a.freeErrors)
		return 0
	}
	if h.buf != nil {
		a.reservedBytes.Add(-size)
	}
	return size
}

// foreign reports a Free of an address this allocator does not hold for
// ONNX Runtime: memapi.ErrForeignHandle, nothing changed.
func (a *Allocator) foreign(addr uint64) {
	a.fail(&memapi.Error{Op: "ort.Allocator.Free", Kind: memapi.ErrForeignHandle,
		Detail: fmt.Sprintf("%#x was not allocated by this allocator (or was freed already)", addr)}, &a.freeErrors)
}

// Unregister takes the allocator out of the ONNX Runtime environment
// (OrtApi::UnregisterAllocator) and keeps it serving the sessions created
// while it was registered: a session takes the environment's allocator
// when it is created, and keeps it. Another allocator can then be
// registered for the sessions created next, each with its own binding and
// pool. It is idempotent.
func (a *Allocator) Unregister() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unregisterLocked()
}

func (a *Allocator) unregisterLocked() error {
	envAlloc.mu.Lock()
	defer envAlloc.mu.Unlock()
	if envAlloc.id != a.id {
		return nil
	}
	if msg := C.memgen_ort_unregister(a.c); msg != nil {
		return cError("ort.Allocator.Unregister", msg)
	}
	envAlloc.id = 0
	return nil
}

// Close empties the front cache into the pool, unregisters the allocator
// from the environment (if it still is) and closes its pool, which gives
// every cached segment back to the binding. It fails with memapi.ErrInUse,
// changing nothing but the front (emptied, caching again), while ONNX
// Runtime still holds blocks from it (destroy the sessions and values
// first). The small C struct ONNX Runtime knew the allocator by is kept for
// the life of the process, since a session created before Close may still
// hold its address; any call through it after Close is refused.
func (a *Allocator) Close() error {
	const op = "ort.Allocator.Close"
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.drainMu.Lock()
	defer a.drainMu.Unlock()
	a.drainLocked(true) // the front off: a Free from now on goes to Go
	if n := a.live.len(); n > 0 {
		a.frontOn()
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Wanted: memapi.Bytes(a.front().live_bytes),
			Detail: fmt.Sprintf("ONNX Runtime still holds %d block(s)", n)}
	}
	err := a.unregisterLocked()
	if err != nil {
		a.frontOn()
		return err
	}
	if err := a.pool.Close(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	publish(a.id, nil) // a late call through the C struct is refused
	C.memgen_ort_front_release(&a.c.front)
	a.closed = true
	return nil
}

// statsValues are the figures GetStats reports, in the order of the C
// bridge's key table (bridge.c, stat_keys): ONNX Runtime's allocator
// statistics (AllocatorStats, the BFC arena's keys).
func (a *Allocator) statsValues() [9]int64 {
	ps := a.pool.Stats()
	st := a.Stats()
	reserved := int64(st.ReservedBytes)
	return [9]int64{
		-1,                             // Limit: the allocator sets none; the governor's budget bounds it
		int64(st.LiveBytes),            // InUse: bytes ONNX Runtime holds (pool blocks rounded, reserved buffers; not the front's)
		int64(ps.Segments) + reserved,  // TotalAllocated: bytes held from the binding
		int64(st.PeakBytes),            // MaxInUse
		int64(st.Allocs + st.Reserves), // NumAllocs: every allocation served
		int64(st.Reserves),             // NumReserves
		int64(ps.SegmentAllocs),        // NumArenaExtensions: the pool's growths
		int64(ps.SegmentFrees),         // NumArenaShrinkages: segments (or region tails) given back
		int64(st.MaxAllocSize),         // MaxAllocSize
	}
}

// memgenOrtAlloc serves Alloc (reserve 0) and Reserve (reserve 1) and
// writes the bytes held into *held; on a refusal it returns 0 and writes why
// into the n bytes at why (NUL-terminated), which the C++ thunk throws to
// ONNX Runtime.
//
//export memgenOrtAlloc
func memgenOrtAlloc(id C.uintptr_t, size C.size_t, reserve C.int, held *C.uint64_t, why *C.char, n C.size_t) C.uintptr_t {
	a := lookup(uintptr(id))
	if a == nil {
		writeC(why, n, "ort: the allocator is closed")
		return 0
	}
	var addr uint64
	var h int64
	var err error
	op := byte('a')
	if reserve != 0 {
		op = 'r'
		addr, h, err = a.reserve(uint64(size))
	} else {
		addr, h, err = a.alloc(uint64(size))
	}
	*held = C.uint64_t(h)
	if a.observe != nil {
		a.observe(op, addr, uint64(size))
	}
	if err != nil {
		writeC(why, n, err.Error())
	}
	return C.uintptr_t(addr)
}

// writeC copies msg, truncated and NUL-terminated, into the n bytes at dst.
func writeC(dst *C.char, n C.size_t, msg string) {
	if dst == nil || n == 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(n))
	k := copy(b[:len(b)-1], msg)
	b[k] = 0
}

// memgenOrtFree serves a Free the front cache did not keep and returns the
// bytes freed (0: none).
//
//export memgenOrtFree
func memgenOrtFree(id C.uintptr_t, p C.uintptr_t) C.int64_t {
	a := lookup(uintptr(id))
	if a == nil {
		return 0
	}
	if a.observe != nil {
		a.observe('f', uint64(p), 0)
	}
	return C.int64_t(a.free(uint64(p), true))
}

// memgenOrtDoubleFree reports a Free of a block the front caches (freed
// already): memapi.ErrForeignHandle, nothing changed.
//
//export memgenOrtDoubleFree
func memgenOrtDoubleFree(id C.uintptr_t, p C.uintptr_t) {
	if a := lookup(uintptr(id)); a != nil {
		a.foreign(uint64(p))
	}
}

// memgenOrtStats fills out (9 values, the order of statsValues) for
// GetStats; it returns 0 when the allocator is closed.
//
//export memgenOrtStats
func memgenOrtStats(id C.uintptr_t, out *C.int64_t) C.int {
	a := lookup(uintptr(id))
	if a == nil {
		return 0
	}
	vals := a.statsValues()
	dst := unsafe.Slice((*int64)(unsafe.Pointer(out)), len(vals))
	copy(dst, vals[:])
	return 1
}

// memgenOrtNoop does nothing: the benchmark calls it from C to measure what
// a cgo callback costs by itself (the floor of every Alloc and Free).
//
//export memgenOrtNoop
func memgenOrtNoop(id C.uintptr_t) C.uintptr_t { return id }
