package llamacpp

/*
#cgo CFLAGS: -O2 -Wall -Wextra -Wno-unused-parameter
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

// Version is the node-llama-cpp release whose prebuilt llama.cpp (CPU,
// linux/x64) this package is built and tested against; scripts/llamacpp.sh
// fetches it.
const Version = "3.21.1"

// LibName is the file name of libllama in that release.
const LibName = "libllama.v0.4.0.so"

var rt struct {
	mu     sync.Mutex
	loaded bool
	lib    string
}

// loadMu serializes models' loads and contexts' creations, so that the
// error llama.cpp logs during one (lastError) is that call's.
var loadMu sync.Mutex

// Init loads libllama from lib (its ggml libraries and CPU backends are
// loaded from the same directory). It fails with an error wrapping
// memapi.ErrInUse when llama.cpp is already loaded. llama.cpp cannot be
// unloaded: Init is once per process.
func Init(lib string) error {
	const op = "llamacpp.Init"
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.loaded {
		return memapi.Errorf(op, memapi.ErrInUse, "llama.cpp is already loaded from %s", rt.lib)
	}
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	cdir := C.CString(filepath.Dir(lib))
	defer C.free(unsafe.Pointer(cdir))
	if msg := C.memgen_llama_load(clib, cdir); msg != nil {
		err := errors.New(C.GoString(msg))
		C.free(unsafe.Pointer(msg))
		return fmt.Errorf("%s: %w", op, err)
	}
	rt.loaded, rt.lib = true, lib
	return nil
}

// Verbose turns llama.cpp's log on standard error on or off (off by
// default; its errors are kept for the package's error messages either
// way).
func Verbose(on bool) {
	v := C.int(0)
	if on {
		v = 1
	}
	C.memgen_llama_set_verbose(v)
}

func loaded() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.loaded
}

// lastError returns (and forgets) the last error line llama.cpp logged
// ("" when none, without allocating).
func lastError() string {
	p := C.memgen_llama_take_error()
	if p == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(p))
	return C.GoString(p)
}

// CHeap is the process's C heap as glibc's malloc counts it (mallinfo2, all
// arenas): what llama.cpp (and any other C code) allocates outside memgen's
// buffers: its contexts' graphs and scheduler, the KV cache's per-cell
// metadata, the vocabulary.
type CHeap struct {
	InUse      int64 // bytes in allocated chunks, mmapped ones included
	FromSystem int64 // bytes the arenas and mmapped chunks take from the system
}

// ReadCHeap reads the process's C heap figures.
func ReadCHeap() CHeap {
	var inUse, sys C.size_t
	C.memgen_llama_c_heap(&inUse, &sys)
	return CHeap{InUse: int64(inUse), FromSystem: int64(sys)}
}
