package llamacpp

/*
#include "bridge.h"
*/
import "C"

import (
	"context"
	"errors"
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
	kind() bufferKind
	free()
}

// bufferKind says what device.c does with a buffer's tensors (its
// BUF_PLAIN, BUF_KV, BUF_WEIGHTS).
type bufferKind C.int

const (
	plainBuffer  bufferKind = 0 // nothing
	kvBufferKind bufferKind = 1 // each gets a Region of its own (initTensor)
	weightsKind  bufferKind = 2 // each is recorded (addTensor)
)

// weightBuffer is a buffer of weights, committed whole: a pmm.Region of
// the model's weights binding where its device offers VirtualBacking (so
// that Sleep can take the backing away and Wake put it back at the same
// address), else a pmm.Buffer.
type weightBuffer struct {
	m    *Model
	reg  *pmm.Region
	buf  *pmm.Buffer
	size memapi.Bytes // committed

	tensors []weightTensor // as llama.cpp placed them (at load)
	// At the first level-2 sleep (reload.go): checked, the tensors were
	// compared with the model file; differs names the first that is not
	// the file's (its region moves instead of being discarded); runs are
	// the reads that reload the region.
	checked bool
	differs string
	runs    []fileRun
}

func (w *weightBuffer) base() memapi.DeviceAddr {
	if w.reg != nil {
		return w.reg.Addr()
	}
	return w.buf.Addr()
}
func (w *weightBuffer) kind() bufferKind { return weightsKind }
func (w *weightBuffer) free()            { w.m.freeWeights(w) }

// hostBuffer is a context's buffer of the host buffer type: a compute
// buffer (activations, sized by llama.cpp's scheduler for UBatch tokens
// against all of NCtx) or the output buffer (logits). It is one pmm.Buffer
// of the context's "compute" binding, committed whole.
type hostBuffer struct {
	c   *Context
	buf *pmm.Buffer
}

func (h *hostBuffer) base() memapi.DeviceAddr { return h.buf.Addr() }
func (h *hostBuffer) kind() bufferKind        { return plainBuffer }
func (h *hostBuffer) free()                   { h.c.freeHost(h) }

// kvTensor is one KV tensor (cache_k_l<i> or cache_v_l<i>): its own
// pmm.Region, reserved for every cell of every stream, committed for the
// rows in use. A context of several sequences has one stream per sequence
// (llama.cpp's non-unified cache): the tensor is [row, cells, streams],
// and stream s's rows are the range [s*stride, (s+1)*stride), its rows in
// use a prefix of it.
type kvTensor struct {
	name     string
	rowBytes memapi.Bytes
	cells    int          // rows per stream
	stride   memapi.Bytes // bytes from one stream's first row to the next's: cells × rowBytes
	region   *pmm.Region
	// backed is, per stream, the committed bytes at the start of its range
	// (a whole number of granules; with one stream, the region's Len).
	backed []memapi.Bytes
}

// resize backs stream s's first rows rows (rounded up to the granule) and
// nothing beyond them: with one stream the region grows or shrinks (a
// prefix); with several, the range between what the stream had and what
// it needs is committed or decommitted (the region is sparse). Shrinking
// releases behind the region's recorded fences. On a refusal nothing
// changed.
func (t *kvTensor) resize(ctx context.Context, s, rows int) error {
	want, _ := memapi.RoundUp(memapi.Bytes(rows)*t.rowBytes, t.region.Granularity())
	have := t.backed[s]
	switch {
	case want == have:
		return nil
	case len(t.backed) == 1 && want > have:
		if err := t.region.Grow(ctx, memapi.Bytes(rows)*t.rowBytes, nil); err != nil {
			return err
		}
	case len(t.backed) == 1:
		if err := t.region.Shrink(ctx, memapi.Bytes(rows)*t.rowBytes, nil); err != nil {
			return err
		}
	case want > have:
		base := memapi.Bytes(s) * t.stride
		if err := t.region.Commit(ctx, memapi.Range{Off: base + have, Len: want - have}); err != nil {
			return err
		}
	default:
		base := memapi.Bytes(s) * t.stride
		if err := t.region.Decommit(ctx, memapi.Range{Off: base + want, Len: have - want}); err != nil {
			return err
		}
	}
	t.backed[s] = want
	return nil
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
func (b *kvBuffer) kind() bufferKind        { return kvBufferKind }
func (b *kvBuffer) free()                   { b.c.freeKV(b) }

// initTensor gives the tensor its own Region. Only the KV cache's tensors
// are accepted: one row per cell, one stream of cells per sequence of the
// context, each stream's range a whole number of granules (so that a
// granule never holds rows of two sequences).
func (b *kvBuffer) initTensor(t *C.struct_ggml_tensor) (memapi.DeviceAddr, error) {
	name := C.GoString(&t.name[0])
	if !strings.HasPrefix(name, "cache_k_l") && !strings.HasPrefix(name, "cache_v_l") {
		return 0, fmt.Errorf("%w: tensor %q in a KV buffer", ErrLayout, name)
	}
	ne1, ne2, ne3 := int64(t.ne[1]), int64(t.ne[2]), int64(t.ne[3])
	rowBytes, stride := memapi.Bytes(t.nb[1]), memapi.Bytes(t.nb[2])
	size := memapi.Bytes(C.memgen_llama_nbytes(t))
	if ne2 != int64(len(b.c.seqs)) || ne3 != 1 || ne1 <= 0 || rowBytes == 0 || stride != rowBytes*memapi.Bytes(ne1) || stride*memapi.Bytes(ne2) != size {
		return 0, fmt.Errorf("%w: %s is %dx%dx%dx%d with rows of %d bytes, streams of %d (%d bytes): not one row per cell in one stream per sequence (%d)",
			ErrLayout, name, int64(t.ne[0]), ne1, ne2, ne3, rowBytes, stride, size, len(b.c.seqs))
	}
	r, err := b.c.bind.ReserveVirtual(context.Background(), size)
	if err != nil {
		return 0, fmt.Errorf("llamacpp: reserving %s (%d bytes): %w", name, size, err)
	}
	if ne2 > 1 && stride%r.Granularity() != 0 {
		return 0, errors.Join(fmt.Errorf("%w: %s: a stream of %d bytes is not a whole number of %d-byte granules", ErrLayout, name, stride, r.Granularity()), r.Close())
	}
	b.mu.Lock()
	b.tensors = append(b.tensors, &kvTensor{name: name, rowBytes: rowBytes, cells: int(ne1), stride: stride, region: r, backed: make([]memapi.Bytes, ne2)})
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

// setMaxBuffer sets the largest buffer of memgen's buffer type (0:
// unlimited, the default): a model loaded after it has its weights in
// buffers of at most n bytes, as many as they take. The tests use it to
// spread the weights over several regions.
func setMaxBuffer(n memapi.Bytes) { C.memgen_llama_set_max_buffer(C.size_t(n)) }

// The functions below are the buffer types' calls into Go (device.c).
// They run in the goroutine that called llama.cpp (a model's load, a
// context's creation, decode or free), never concurrently for one owner.

//export memgenLlamaAlloc
func memgenLlamaAlloc(owner C.uintptr_t, size C.size_t, host C.int, handle *C.uintptr_t, kind *C.int) (addr C.uintptr_t) {
	if owner == 0 {
		return 0 // an allocation outside the bridge's calls: nothing to charge it to
	}
	a := cgo.Handle(owner).Value().(allocator)
	b, err := a.allocBuffer(memapi.Bytes(size), host != 0)
	if err != nil {
		return 0
	}
	*handle = C.uintptr_t(cgo.NewHandle(b))
	*kind = C.int(b.kind())
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

//export memgenLlamaWeightTensor
func memgenLlamaWeightTensor(handle C.uintptr_t, t *C.struct_ggml_tensor) {
	w := cgo.Handle(handle).Value().(*weightBuffer)
	w.addTensor(C.GoString(&t.name[0]), memapi.DeviceAddr(uintptr(t.data)), memapi.Bytes(C.memgen_llama_nbytes(t)))
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
