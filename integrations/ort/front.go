package ort

/*
#include "bridge.h"
*/
import "C"

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// The front cache (front.h, front.c) keeps freed pool blocks of up to
// pool.SmallMax bytes in C, binned by the pool's size classes, so that
// ONNX Runtime's Alloc of a class the front holds and its Free of a block
// the front has room for never call into Go: two cgo callbacks alone cost
// more than ONNX Runtime's arena's whole Alloc+Free (docs/ort.md). The
// front's blocks stay held pool blocks (in the Go address map, in use as
// the pool counts them, charged to the holder), so the C side can lose
// nothing: a block it does not keep or cannot track goes to Go as before.
// They are cache all the same, and the Allocator, as the governor's holder,
// says so: CachedBytes counts them, Reclaim gives them back first.

const (
	// DefaultFrontBytes bounds the front's bytes by default: tcmalloc's
	// bound on one thread's cache (kMaxThreadCacheSize), 64 blocks of
	// 64 KiB.
	DefaultFrontBytes = 4 << 20
	// DefaultFrontDepth bounds the blocks the front keeps per class by
	// default.
	DefaultFrontDepth = 64
)

var (
	_ governor.Holder        = (*Allocator)(nil)
	_ governor.CacheReporter = (*Allocator)(nil)
)

// frontBounds returns the front's byte cap (0: off) and per-bin depth from
// opts.
func frontBounds(opts Options) (int64, int) {
	fb := opts.FrontBytes
	switch {
	case fb == 0:
		fb = DefaultFrontBytes
	case fb < 0:
		fb = 0
	}
	depth := opts.FrontDepth
	if depth <= 0 {
		depth = DefaultFrontDepth
	}
	return fb, min(max(depth, 1), C.MEMGEN_ORT_FRONT_MAX_DEPTH)
}

// front reads the front's figures.
func (a *Allocator) front() C.memgen_ort_front_stats {
	var st C.memgen_ort_front_stats
	C.memgen_ort_front_read(&a.c.front, &st)
	return st
}

// Reclaim is the allocator's answer to a pressure ticket (governor.Holder):
// it empties the whole front cache into the pool, through the pool's Free,
// then asks the pool's Reclaim, and reports the bytes the pool gave back.
// Like the pool's it never touches a block ONNX Runtime holds and may free
// 0.
func (a *Allocator) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	a.drain()
	return a.pool.Reclaim(ctx, t)
}

// Trim empties the front cache, then gives back every cached segment of the
// pool (pool.Pool.Trim), and reports the bytes the pool gave back.
func (a *Allocator) Trim(ctx context.Context) (memapi.Bytes, error) {
	a.drain()
	return a.pool.Trim(ctx)
}

// CachedBytes reports the allocator's cache on authority auth
// (governor.CacheReporter): the pool's cached bytes and the front's, on the
// binding's authority, 0 on any other. Read while ONNX Runtime allocates,
// the two figures are not taken at one instant; the governor bounds the
// sum by the holder's charge.
func (a *Allocator) CachedBytes(auth memapi.AuthorityID) memapi.Bytes {
	if own, err := a.bind.Authority(); err != nil || own != auth {
		return 0
	}
	return a.pool.CachedBytes(auth) + memapi.Bytes(a.front().cached_bytes)
}

// drain empties the front into the pool.
func (a *Allocator) drain() {
	a.drainMu.Lock()
	defer a.drainMu.Unlock()
	a.drainLocked(false)
}

// drainLocked takes every block out of the front (and, with disable, turns
// it off in the same step) and frees them through Go, the way a Free that
// reaches Go frees a block; the caller holds drainMu. A block whose Free
// fails stays in the Go map, held and visible (FreeErrors, LastError).
func (a *Allocator) drainLocked(disable bool) int {
	if a.frontMax == 0 {
		return 0
	}
	buf := make([]C.uintptr_t, a.frontMax)
	d := C.int(0)
	if disable {
		d = 1
	}
	n := int(C.memgen_ort_front_drain(&a.c.front, &buf[0], C.size_t(len(buf)), d))
	for _, p := range buf[:n] {
		a.free(uint64(p), false)
	}
	return n
}

// frontOn lets the front cache again, unless Options turned it off or
// observe is set (setObserve).
func (a *Allocator) frontOn() {
	if a.observe == nil {
		C.memgen_ort_front_enable(&a.c.front, 1)
	}
}

// setObserve sets observe; while it is set the front is off (emptied), so
// that every Alloc and Free reaches Go and is seen.
func (a *Allocator) setObserve(f func(op byte, addr, size uint64)) {
	a.drainMu.Lock()
	defer a.drainMu.Unlock()
	a.observe = f
	if f != nil {
		a.drainLocked(true)
	} else {
		a.frontOn()
	}
}

// frontClassSize is the size of the class the front bins a request of n
// bytes in (0: none); the test holds it to the pool's rounding.
func (a *Allocator) frontClassSize(n int) uint64 {
	c := C.memgen_ort_front_class(&a.c.front, C.size_t(n))
	if c < 0 {
		return 0
	}
	return uint64(a.c.front.class_size[c])
}

// frontStress runs the C threads of memgen_ort_front_stress against the
// allocator and returns their error count.
func (a *Allocator) frontStress(threads, iters int) int {
	return int(C.memgen_ort_front_stress(C.memgen_ort_base(a.c), C.int(threads), C.long(iters)))
}

// frontFailGrow makes the growth of the front's map fail (the tests' fault
// injection: calloc failing).
func (a *Allocator) frontFailGrow(on bool) {
	v := C.int(0)
	if on {
		v = 1
	}
	C.memgen_ort_front_fail_grow(&a.c.front, v)
}

// frontEnabled reports whether the front caches now.
func (a *Allocator) frontEnabled() bool { return a.front().enabled != 0 }
