package ort

/*
#include "bridge.h"
*/
import "C"

import "unsafe"

// These call the allocators through the C function pointers, as ONNX
// Runtime does; the Alloc+Free benchmark uses them (cgo cannot be called
// from test files).

// cAlloc calls the allocator's OrtAllocator::Alloc; 0 when refused.
func (a *Allocator) cAlloc(size int) unsafe.Pointer {
	return C.memgen_ort_alloc_call(a.c, C.size_t(size))
}

// cFree calls the allocator's OrtAllocator::Free.
func (a *Allocator) cFree(p unsafe.Pointer) { C.memgen_ort_free_call(a.c, p) }

// defaultAlloc and defaultFree use ONNX Runtime's default CPU allocator.
func defaultAlloc(size int) unsafe.Pointer { return C.memgen_ort_default_alloc(C.size_t(size)) }

func defaultFree(p unsafe.Pointer) { C.memgen_ort_default_free(p) }
