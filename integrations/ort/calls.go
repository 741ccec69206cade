package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// These call the allocators through the C function pointers, as ONNX
// Runtime does; the tests and benchmarks use them (cgo cannot be called
// from test files).

// cAlloc calls the allocator's OrtAllocator::Alloc; 0 when refused.
func (a *Allocator) cAlloc(size int) unsafe.Pointer {
	return C.memgen_ort_alloc_call(a.c, C.size_t(size))
}

// cReserve calls the allocator's OrtAllocator::Reserve; 0 when refused.
func (a *Allocator) cReserve(size int) unsafe.Pointer {
	return C.memgen_ort_reserve_call(a.c, C.size_t(size))
}

// cFree calls the allocator's OrtAllocator::Free.
func (a *Allocator) cFree(p unsafe.Pointer) { C.memgen_ort_free_call(a.c, p) }

// ortAllocator is an OrtAllocator seen from Go: this package's (through
// base) or one of ONNX Runtime's.
type ortAllocator struct{ p *C.OrtAllocator }

func (a *Allocator) base() ortAllocator { return ortAllocator{C.memgen_ort_base(a.c)} }

// allocFreeLoop calls Alloc and Free n times from C, as ONNX Runtime does;
// it reports whether all n succeeded.
func (o ortAllocator) allocFreeLoop(size, n int) bool {
	return C.memgen_ort_alloc_free_loop(o.p, C.size_t(size), C.long(n)) == C.long(n)
}

// callbackLoop makes 2n cgo callbacks into Go that do nothing.
func callbackLoop(n int) { C.memgen_ort_callback_loop(C.long(n)) }

// statKeys are GetStats' keys, in order.
var statKeys = func() (k [C.MEMGEN_ORT_NSTATS]string) {
	for i := range k {
		k[i] = C.GoString(C.memgen_ort_stat_key(C.int(i)))
	}
	return k
}()

// stats reads o's statistics through its GetStats slot (viaAPI false) or
// through OrtApi::AllocatorGetStats (viaAPI true): the keys found, with
// their values.
func (o ortAllocator) stats(viaAPI bool) (map[string]int64, error) {
	var vals [C.MEMGEN_ORT_NSTATS]C.int64_t
	var found [C.MEMGEN_ORT_NSTATS]C.int
	via := C.int(0)
	if viaAPI {
		via = 1
	}
	if msg := C.memgen_ort_get_stats(o.p, via, &vals[0], &found[0]); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return nil, errors.New(C.GoString(msg))
	}
	m := map[string]int64{}
	for i, k := range statKeys {
		if found[i] != 0 {
			m[k] = int64(vals[i])
		}
	}
	return m, nil
}

// sessionAllocator wraps the session's CPU allocator (OrtApi::
// CreateAllocator): for a session with use_env_allocators, the registered
// Allocator as ONNX Runtime wraps it; otherwise the session's own (its BFC
// arena, unless the arena is disabled). Release it with release.
func (s *session) allocator() (ortAllocator, error) {
	var p *C.OrtAllocator
	if err := cErr(C.memgen_ort_session_allocator(s.s, &p)); err != nil {
		return ortAllocator{}, err
	}
	return ortAllocator{p}, nil
}

func (o ortAllocator) release() { C.memgen_ort_release_allocator(o.p) }

// defaultAllocator is ONNX Runtime's default CPU allocator
// (OrtApi::GetAllocatorWithDefaultOptions: no arena, malloc and free).
func defaultAllocator() (ortAllocator, error) {
	var p *C.OrtAllocator
	if err := cErr(C.memgen_ort_default_allocator(&p)); err != nil {
		return ortAllocator{}, err
	}
	return ortAllocator{p}, nil
}
