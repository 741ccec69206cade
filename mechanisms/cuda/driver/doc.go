// Package driver is the binding to the CUDA driver API that the cuda
// mechanism uses: a function table holding exactly the entry points it calls,
// the C types and struct layouts those entry points take, and the CUresult
// codes with their names.
//
// The table is filled in one of two ways. Open loads libcuda.so.1 at run time
// with github.com/ebitengine/purego (no cgo, no CUDA headers at build time):
// every symbol is looked up with Dlsym before it is registered, so a missing
// symbol is an error instead of a panic. The simulator in package cudasim
// fills the same table with Go functions, so the mechanism runs unchanged on
// machines with no GPU.
//
// Structs cross the boundary by pointer only (purego's struct-by-value
// support is unreliable on amd64); their sizes are asserted at compile time
// against the C layouts of cuda.h.
//
// The CUDA context is current per OS thread. The table itself does nothing
// about that: its caller (the cuda mechanism) runs every call on one locked
// OS thread per device with the primary context current.
package driver
