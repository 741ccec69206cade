package llamacpp

/*
#include "bridge.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime/cgo"
	"strings"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// allocator is what a buffer of the memgen buffer types is allocated for:
// a Model while it loads (weights), a Context while llama.cpp creates it
// (KV cache, compute and output buffers) or decodes (a compute or output
// buffer llama.cpp grows). host says the buffer is of the host buffer
// type (what the CPU computes in).
type allocator interface {
	allocBuffer(size memapi.Bytes, host bool) (buffer, error)
}

// buffer is the Go side of one ggml buffer of the memgen buffer type.
type buffer interface {
	base() memapi.DeviceAddr
	kv() bool
	free()
}

// weightBuffer is a buffer of weights: one pmm.Buffer of the model's
// weights binding, committed whole.
type weightBuffer struct {
	m   *Model
	buf *pmm.Buffer
}

func (w *weightBuffer) base() memapi.DeviceAddr { return w.buf.Addr() }
func (w *weightBuffer) kv() bool                { return false }
func (w *weightBuffer) free()                   { w.m.freeWeights(w) }

// hostBuffer is a context's buffer of the host buffer type: a compute
// buffer (activations, sized by llama.cpp's scheduler for UBatch tokens
// against all of NCtx) or the output buffer (logits). It is one pmm.Buffer
// of the context's "compute" binding, committed whole.
type hostBuffer struct {
	c   *Context
	buf *pmm.Buffer
}

func (h *hostBuffer) base() memapi.DeviceAddr { return h.buf.Addr() }
func (h *hostBuffer) kv() bool                { return false }
func (h *hostBuffer) free()                   { h.c.freeHost(h) }

// kvTensor is one KV tensor (cache_k_l<i> or cache_v_l<i>): its own
// pmm.Region, reserved for every cell, committed for the rows in use.
type kvTensor struct {
	name     string
	rowBytes memapi.Bytes
	cells    int
	region   *pmm.Region
}

// kvBuffer is the buffer llama.cpp allocates for a context's KV cache: a
// Region reserved for its size, never committed (ggml's offsets in it are
// not used: each tensor is pointed at a Region of its own).
type kvBuffer struct {
	c       *Context
	reserve *pmm.Region

	mu      sync.Mutex
	tensors []*kvTensor
}

func (b *kvBuffer) base() memapi.DeviceAddr { return b.reserve.Addr() }
func (b *kvBuffer) kv() bool                { return true }
func (b *kvBuffer) free()                   { b.c.freeKV(b) }

// initTensor gives the tensor its own Region. Only the KV cache's tensors,
// one row per cell, are accepted.
func (b *kvBuffer) initTensor(t *C.struct_ggml_tensor) (memapi.DeviceAddr, error) {
	name := C.GoString(&t.name[0])
	if !strings.HasPrefix(name, "cache_k_l") && !strings.HasPrefix(name, "cache_v_l") {
		return 0, fmt.Errorf("%w: tensor %q in a KV buffer", ErrLayout, name)
	}
	ne1, ne2, ne3 := int64(t.ne[1]), int64(t.ne[2]), int64(t.ne[3])
	rowBytes := memapi.Bytes(t.nb[1])
	size := memapi.Bytes(C.memgen_llama_nbytes(t))
	if ne2 != 1 || ne3 != 1 || ne1 <= 0 || rowBytes == 0 || rowBytes*memapi.Bytes(ne1) != size {
		return 0, fmt.Errorf("%w: %s is %dx%dx%dx%d with rows of %d bytes (%d bytes): not one row per cell",
			ErrLayout, name, int64(t.ne[0]), ne1, ne2, ne3, rowBytes, size)
	}
	r, err := b.c.bind.ReserveVirtual(context.Background(), size)
	if err != nil {
		return 0, fmt.Errorf("llamacpp: reserving %s (%d bytes): %w", name, size, err)
	}
	b.mu.Lock()
	b.tensors = append(b.tensors, &kvTensor{name: name, rowBytes: rowBytes, cells: int(ne1), region: r})
	b.mu.Unlock()
	return r.Addr(), nil
}

// clear sets the committed rows of every tensor to v.
func (b *kvBuffer) clear(v byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.tensors {
		if n := t.region.Committed(); n > 0 {
			C.memgen_llama_memset(C.uintptr_t(t.region.Addr()), C.int(v), C.size_t(n))
		}
	}
}

// The functions below are the buffer types' calls into Go (device.c).
// They run in the goroutine that called llama.cpp (a model's load, a
// context's creation, decode or free), never concurrently for one owner.

//export memgenLlamaAlloc
func memgenLlamaAlloc(owner C.uintptr_t, size C.size_t, host C.int, handle *C.uintptr_t, kv *C.int) (addr C.uintptr_t) {
	if owner == 0 {
		return 0 // an allocation outside the bridge's calls: nothing to charge it to
	}
	a := cgo.Handle(owner).Value().(allocator)
	b, err := a.allocBuffer(memapi.Bytes(size), host != 0)
	if err != nil {
		return 0
	}
	*handle = C.uintptr_t(cgo.NewHandle(b))
	if b.kv() {
		*kv = 1
	}
	return C.uintptr_t(b.base())
}

//export memgenLlamaInitTensor
func memgenLlamaInitTensor(handle C.uintptr_t, t *C.struct_ggml_tensor) C.uintptr_t {
	b := cgo.Handle(handle).Value().(*kvBuffer)
	addr, err := b.initTensor(t)
	if err != nil {
		b.c.setAllocErr(err)
		return 0
	}
	return C.uintptr_t(addr)
}

//export memgenLlamaFree
func memgenLlamaFree(handle C.uintptr_t) {
	h := cgo.Handle(handle)
	b := h.Value().(buffer)
	h.Delete()
	b.free()
}

//export memgenLlamaClear
func memgenLlamaClear(handle C.uintptr_t, v C.uint8_t) {
	cgo.Handle(handle).Value().(*kvBuffer).clear(byte(v))
}
