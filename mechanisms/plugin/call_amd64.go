package plugin

import (
	"unsafe"

	_ "github.com/ebitengine/purego" // sets up runtime.cgocall without cgo (internal/fakecgo)
)

// cTrampolineABI0 is the address of cTrampoline (call_amd64.s).
var cTrampolineABI0 uintptr

// runtime_cgocall runs fn(arg) on the system stack as a cgo call does
// (the goroutine is in a system call meanwhile, so its stack does not move).
// purego links the same function; the runtime keeps it linkable for it.
//
//go:linkname runtime_cgocall runtime.cgocall
//go:noescape
func runtime_cgocall(fn uintptr, arg unsafe.Pointer) int32

// cCall calls a.fn with a's six arguments and stores its integer result in
// a.r. A slot takes at most six integer arguments, all passed in registers,
// so the trampoline is a fixed register load and a call: none of purego's
// general marshalling (32 arguments, float registers, a pooled block).
//
// a may live on the goroutine's stack: runtime_cgocall takes it as a typed
// pointer, adjusted if its own prologue grows the stack, and from its
// entersyscall until the C function returns the goroutine is in a system
// call, where its stack is neither moved nor shrunk (and a slot never calls
// back into Go: the ABI forbids it). What a's arguments point to is the
// caller's to keep in place (go:uintptrescapes on callC).
func cCall(a *cArgs) {
	runtime_cgocall(cTrampolineABI0, unsafe.Pointer(a))
}
