package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// DefaultWait is how long Alloc waits for the governor by default when the
// binding's capacity is short: long enough for pending frees (another
// session's released blocks waiting in the deferred-free queue) and holders
// answering pressure tickets, short enough that a session over budget fails
// promptly.
const DefaultWait = 100 * time.Millisecond

// Options configure an Allocator.
type Options struct {
	// Wait bounds how long one Alloc waits for the governor when capacity
	// is short. 0 means DefaultWait; a negative value means no wait.
	Wait time.Duration
	// OnError, when set, is called (from ONNX Runtime's thread) with every
	// failed Alloc and every failed Free. A failed Alloc returns NULL to
	// ONNX Runtime (as an exception it turns into its error status); a
	// failed Free leaves the block charged.
	OnError func(err error)
}

// Stats count an Allocator's calls.
type Stats struct {
	Allocs     uint64       // successful Alloc and Reserve calls
	Frees      uint64       // successful Free calls
	Refused    uint64       // Alloc calls refused (over budget, or the mechanism failed)
	FreeErrors uint64       // Free calls that failed (unknown pointer or release error)
	Live       int          // blocks ONNX Runtime holds now
	LiveBytes  memapi.Bytes // their physical size (rounded to the mechanism's allocation granularity)
	PeakBytes  memapi.Bytes // the most LiveBytes has been since NewAllocator or ResetPeak
}

// Allocator is an OrtAllocator whose memory comes from a memgen binding.
// NewAllocator registers it with the ONNX Runtime environment; sessions
// created with SessionOptions then allocate through it. Only one allocator
// for CPU memory can be registered in the environment at a time.
type Allocator struct {
	id   uintptr
	bind *pmm.Binding
	opts Options
	c    *C.memgen_ort_allocator
	live addrMap

	allocs, frees, refused, freeErrors atomic.Uint64
	liveBytes, peakBytes               atomic.Int64
	lastErr                            atomic.Pointer[error]

	mu     sync.Mutex
	closed bool
}

// allocators finds the Go allocator from the id the C struct carries. A
// closed allocator is removed: a late call from ONNX Runtime finds nothing
// and is refused instead of touching freed state.
var (
	allocators sync.Map // uintptr -> *Allocator
	nextID     atomic.Uintptr
)

// NewAllocator makes an allocator over b and registers it with the ONNX
// Runtime environment loaded by Init. It fails when ONNX Runtime is not
// loaded or when an allocator for CPU memory is already registered (ONNX
// Runtime's status message says so).
func NewAllocator(b *pmm.Binding, opts Options) (*Allocator, error) {
	const op = "ort.NewAllocator"
	if b == nil {
		return nil, memapi.Errorf(op, memapi.ErrNilHandle, "no binding")
	}
	if opts.Wait == 0 {
		opts.Wait = DefaultWait
	}
	a := &Allocator{id: nextID.Add(1), bind: b, opts: opts}
	var msg *C.char
	a.c = C.memgen_ort_new_allocator(C.uintptr_t(a.id), &msg)
	if a.c == nil {
		return nil, cError(op, msg)
	}
	allocators.Store(a.id, a)
	if msg := C.memgen_ort_register(a.c); msg != nil {
		allocators.Delete(a.id)
		return nil, cError(op, msg)
	}
	return a, nil
}

func cError(op string, msg *C.char) error {
	defer C.free(unsafe.Pointer(msg))
	return fmt.Errorf("%s: %s", op, C.GoString(msg))
}

// Binding returns the binding the allocator draws from.
func (a *Allocator) Binding() *pmm.Binding { return a.bind }

// Stats returns the allocator's counters.
func (a *Allocator) Stats() Stats {
	return Stats{
		Allocs:     a.allocs.Load(),
		Frees:      a.frees.Load(),
		Refused:    a.refused.Load(),
		FreeErrors: a.freeErrors.Load(),
		Live:       a.live.len(),
		LiveBytes:  memapi.Bytes(a.liveBytes.Load()),
		PeakBytes:  memapi.Bytes(a.peakBytes.Load()),
	}
}

// ResetPeak restarts Stats.PeakBytes from the bytes held now.
func (a *Allocator) ResetPeak() { a.peakBytes.Store(a.liveBytes.Load()) }

// LastError returns the error of the latest refused Alloc or failed Free,
// nil when there was none: typically a *governor.OverBudgetError. (ONNX
// Runtime's status carries its message too.)
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

// alloc serves OrtAllocator::Alloc and ::Reserve. A zero-byte request gets
// a block of one allocation granule, as malloc(0) may return a unique
// pointer.
func (a *Allocator) alloc(size uint64) (uint64, error) {
	ctx := context.Background()
	if a.opts.Wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, a.opts.Wait)
		defer cancel()
	} else {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		cancel() // no wait: the governor answers from what is free now
	}
	buf, err := a.bind.Allocate(ctx, memapi.Bytes(max(size, 1)))
	if err != nil {
		err = fmt.Errorf("ort.Allocator.Alloc of %d bytes: %w", size, err)
		a.fail(err, &a.refused)
		return 0, err
	}
	addr := uint64(buf.Addr())
	a.live.put(addr, buf)
	live := a.liveBytes.Add(int64(buf.Size()))
	for peak := a.peakBytes.Load(); live > peak && !a.peakBytes.CompareAndSwap(peak, live); peak = a.peakBytes.Load() {
	}
	a.allocs.Add(1)
	return addr, nil
}

// free serves OrtAllocator::Free: the buffer is found from the address and
// closed, which releases it through the device context's deferred-free
// queue and refunds the holder after the free.
func (a *Allocator) free(addr uint64) {
	buf := a.live.take(addr)
	if buf == nil {
		a.fail(&memapi.Error{Op: "ort.Allocator.Free", Kind: memapi.ErrForeignHandle,
			Detail: fmt.Sprintf("%#x was not allocated by this allocator (or was freed already)", addr)}, &a.freeErrors)
		return
	}
	size := buf.Size()
	if err := buf.Close(); err != nil {
		a.live.put(addr, buf) // still held: a later Free may succeed
		a.fail(fmt.Errorf("ort.Allocator.Free of %#x: %w", addr, err), &a.freeErrors)
		return
	}
	a.liveBytes.Add(-int64(size))
	a.frees.Add(1)
}

// Close unregisters the allocator from the environment. It fails with
// memapi.ErrInUse, and stays registered, while ONNX Runtime still holds
// blocks from it (destroy the sessions and values first). The small C
// struct ONNX Runtime knew the allocator by is kept for the life of the
// process, since a session created before Close may still hold its address;
// any call through it after Close is refused.
func (a *Allocator) Close() error {
	const op = "ort.Allocator.Close"
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	if n := a.live.len(); n > 0 {
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Wanted: memapi.Bytes(a.liveBytes.Load()),
			Detail: fmt.Sprintf("ONNX Runtime still holds %d block(s)", n)}
	}
	var err error
	if msg := C.memgen_ort_unregister(a.c); msg != nil {
		err = cError(op, msg)
	}
	allocators.Delete(a.id)
	a.closed = true
	return err
}

// memgenOrtAlloc serves Alloc and Reserve; on a refusal it returns 0 and
// writes why into the n bytes at why (NUL-terminated), which the C++ thunk
// throws to ONNX Runtime.
//
//export memgenOrtAlloc
func memgenOrtAlloc(id C.uintptr_t, size C.size_t, why *C.char, n C.size_t) C.uintptr_t {
	v, ok := allocators.Load(uintptr(id))
	if !ok {
		writeC(why, n, "ort: the allocator is closed")
		return 0
	}
	addr, err := v.(*Allocator).alloc(uint64(size))
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

//export memgenOrtFree
func memgenOrtFree(id C.uintptr_t, p C.uintptr_t) {
	v, ok := allocators.Load(uintptr(id))
	if !ok {
		return
	}
	v.(*Allocator).free(uint64(p))
}
