package ort

/*
#cgo CFLAGS: -O2
#cgo CXXFLAGS: -O2 -std=c++17
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	ortgo "github.com/yalue/onnxruntime_go"

	"github.com/memgen/memgen/generated/memapi"
)

// Version is the ONNX Runtime release this package is built and tested
// against; Init refuses a library reporting another one unless
// InitOptions.AnyVersion is set.
const Version = "1.30.0"

// InitOptions configure Init.
type InitOptions struct {
	// AnyVersion accepts a library whose version string is not Version (it
	// must still serve the C API version of the headers).
	AnyVersion bool
	// Quiet sets the environment's log level to fatal, silencing the
	// errors ONNX Runtime logs for models it rejects (they are returned
	// as statuses all the same).
	Quiet bool
}

var rt struct {
	mu      sync.Mutex
	loaded  bool
	version string
}

// Init loads the ONNX Runtime shared library at libPath: onnxruntime_go's
// environment (sessions, tensors) and the bridge's handle on the same
// environment (allocator registration). It fails with an error wrapping
// memapi.ErrInUse when the runtime is already loaded.
func Init(libPath string, opts InitOptions) error {
	const op = "ort.Init"
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.loaded {
		return memapi.Errorf(op, memapi.ErrInUse, "ONNX Runtime is already loaded (version %s)", rt.version)
	}
	ortgo.SetSharedLibraryPath(libPath)
	level := ortgo.WithLogLevelError()
	if opts.Quiet {
		level = ortgo.WithLogLevelFatal()
	}
	if err := ortgo.InitializeEnvironment(level); err != nil {
		return fmt.Errorf("%s: %s: %w", op, libPath, err)
	}
	cpath := C.CString(libPath)
	defer C.free(unsafe.Pointer(cpath))
	if msg := C.memgen_ort_load(cpath); msg != nil {
		err := errors.New(C.GoString(msg))
		C.free(unsafe.Pointer(msg))
		return errors.Join(fmt.Errorf("%s: %s: %w", op, libPath, err), ortgo.DestroyEnvironment())
	}
	v := C.GoString(C.memgen_ort_version())
	if v != Version && !opts.AnyVersion {
		C.memgen_ort_unload()
		return errors.Join(fmt.Errorf("%s: %s reports ONNX Runtime %s, want %s", op, libPath, v, Version), ortgo.DestroyEnvironment())
	}
	rt.loaded, rt.version = true, v
	return nil
}

// RuntimeVersion returns the loaded library's version string, "" before
// Init.
func RuntimeVersion() string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.version
}

// Shutdown releases the environment. Every session and allocator must be
// closed first.
func Shutdown() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if !rt.loaded {
		return nil
	}
	C.memgen_ort_unload()
	rt.loaded, rt.version = false, ""
	return ortgo.DestroyEnvironment()
}

// SessionOptions returns onnxruntime_go session options whose sessions use
// the environment's registered allocators (session.use_env_allocators=1):
// with an Allocator registered, every CPU allocation of such a session goes
// through it. The caller destroys the options.
func SessionOptions() (*ortgo.SessionOptions, error) {
	o, err := ortgo.NewSessionOptions()
	if err != nil {
		return nil, err
	}
	if err := o.AddSessionConfigEntry("session.use_env_allocators", "1"); err != nil {
		return nil, errors.Join(err, o.Destroy())
	}
	return o, nil
}
