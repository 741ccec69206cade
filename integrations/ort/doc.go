// Package ort puts ONNX Runtime's CPU allocations under a memgen binding.
//
// An Allocator is an OrtAllocator, registered with the process's ONNX
// Runtime environment (OrtApi::RegisterAllocator), whose Alloc, Reserve,
// Free and Info are Go functions reached through a small cgo bridge. Every
// block ONNX Runtime asks for is a pmm.Buffer allocated from a
// pmm.Binding: the bytes are reserved from the governor, committed into
// the binding's holder's charge, backed by the CPU mechanism, and refunded
// when ONNX Runtime frees the block (through the device context's
// deferred-free queue, like every memgen release). Sessions use it when
// created with the session option `session.use_env_allocators` = "1"
// (SessionOptions does that); sessions created without it keep ONNX
// Runtime's own arena.
//
// Alloc and Free are called from ONNX Runtime's own threads; both are safe
// for concurrent use. Free finds the buffer from the pointer in O(1) (a
// sharded map from address to buffer). When the binding's budget is
// exhausted (the governor refuses the reservation after Options.Wait), the
// allocation is refused and ONNX Runtime fails the session call with its own
// error status, whose message carries memgen's reason; the ledger is
// untouched and the session stays usable. The refusal reaches ONNX Runtime
// as a std::bad_alloc thrown by the Alloc entry point (alloc_thunk.cc), not
// as a NULL return: ONNX Runtime 1.30 dereferences a NULL from a custom
// allocator in places (a segmentation fault, found by this package's tests),
// while it turns every exception into its error status, as for its own CPU
// allocator's failures.
//
// Sessions and tensors come from github.com/yalue/onnxruntime_go: Init loads
// the library through it and opens the same library for the bridge, which
// asks for C API version 24 (ORT_API_VERSION, served by ONNX Runtime
// 1.30.0). The bridge declares the part of the C API it uses itself, in
// ortapi.h; ortapi_test.go holds those declarations to onnxruntime_go's
// onnxruntime_c_api.h (slot offsets and types, OrtAllocator's layout, enum
// values).
//
// This package is a nested Go module so that memgen's core module stays
// free of cgo and of ONNX Runtime; `make ort` fetches the runtime and the
// ONNX conformance models, `make ort-test` runs this module's tests.
package ort
