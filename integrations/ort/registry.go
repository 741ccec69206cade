package ort

import (
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
)

// The C struct ONNX Runtime knows an allocator by carries an id, not a Go
// pointer (cgo forbids Go pointers in C memory); every call from ONNX
// Runtime finds the Go allocator from it. Ids are never reused: a closed
// allocator's id finds nothing for the rest of the process, so a late call
// through its struct is refused instead of reaching another allocator.
//
// The table is two-level, its chunks made on first use: a lookup is two
// atomic loads and no hashing (a sync.Map's lookup was a tenth of the
// Alloc+Free path).
const (
	idChunk   = 256
	idChunks  = 256
	maxAllocs = idChunk*idChunks - 1 // id 0 is never used
)

var registry struct {
	mu     sync.Mutex // makes chunks, hands out ids
	next   uintptr
	chunks [idChunks]atomic.Pointer[[idChunk]atomic.Pointer[Allocator]]
}

// newID reserves an id for a new allocator.
func newID() (uintptr, error) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.next >= maxAllocs {
		return 0, memapi.Errorf("ort.NewAllocator", memapi.ErrOutOfMemory, "the process made %d allocators, the most it can", maxAllocs)
	}
	registry.next++
	id := registry.next
	c := &registry.chunks[id/idChunk]
	if c.Load() == nil {
		c.Store(new([idChunk]atomic.Pointer[Allocator]))
	}
	return id, nil
}

func slot(id uintptr) *atomic.Pointer[Allocator] {
	if id == 0 || id > maxAllocs {
		return nil
	}
	c := registry.chunks[id/idChunk].Load()
	if c == nil {
		return nil
	}
	return &c[id%idChunk]
}

// publish makes a reachable from its id (nil: unreachable for good).
func publish(id uintptr, a *Allocator) {
	if s := slot(id); s != nil {
		s.Store(a)
	}
}

// lookup finds the open allocator of id, nil when there is none.
func lookup(id uintptr) *Allocator {
	if s := slot(id); s != nil {
		return s.Load()
	}
	return nil
}
