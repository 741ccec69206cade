package driver

import "unsafe"

// Table holds exactly the driver entry points the cuda mechanism calls, and
// two its tests call (cuMemcpyDtoHAsync_v2, to read device memory from a
// non-blocking stream; cuEventSynchronize, the blocking wait the fences do
// not use), with the C signatures of cuda.h (out-parameters and structs by pointer, size_t as
// uint64: the driver API exists only on 64-bit platforms). Open fills it from
// libcuda.so.1; cudasim fills it with a simulator. Every field is set in a
// table either returns.
type Table struct {
	// Source says where the entry points come from: the library path, or "cudasim".
	Source string

	Init                        func(flags uint32) Result                                                          // cuInit
	DeviceGet                   func(dev *Device, ordinal int32) Result                                            // cuDeviceGet
	DeviceGetAttribute          func(pi *int32, attr DeviceAttr, dev Device) Result                                // cuDeviceGetAttribute
	DevicePrimaryCtxRetain      func(pctx *Context, dev Device) Result                                             // cuDevicePrimaryCtxRetain
	DevicePrimaryCtxRelease     func(dev Device) Result                                                            // cuDevicePrimaryCtxRelease_v2
	CtxSetCurrent               func(ctx Context) Result                                                           // cuCtxSetCurrent
	MemGetInfo                  func(free, total *uint64) Result                                                   // cuMemGetInfo_v2
	MemAlloc                    func(dptr *DevicePtr, size uint64) Result                                          // cuMemAlloc_v2
	MemFree                     func(dptr DevicePtr) Result                                                        // cuMemFree_v2
	MemsetD8                    func(dst DevicePtr, value uint8, n uint64) Result                                  // cuMemsetD8_v2
	MemAddressReserve           func(ptr *DevicePtr, size, alignment uint64, addr DevicePtr, flags uint64) Result  // cuMemAddressReserve
	MemAddressFree              func(ptr DevicePtr, size uint64) Result                                            // cuMemAddressFree
	MemCreate                   func(handle *MemHandle, size uint64, prop *MemAllocationProp, flags uint64) Result // cuMemCreate
	MemRelease                  func(handle MemHandle) Result                                                      // cuMemRelease
	MemMap                      func(ptr DevicePtr, size, offset uint64, handle MemHandle, flags uint64) Result    // cuMemMap
	MemUnmap                    func(ptr DevicePtr, size uint64) Result                                            // cuMemUnmap
	MemSetAccess                func(ptr DevicePtr, size uint64, desc *MemAccessDesc, count uint64) Result         // cuMemSetAccess
	MemGetAllocationGranularity func(granularity *uint64, prop *MemAllocationProp, option int32) Result            // cuMemGetAllocationGranularity
	StreamCreate                func(stream *Stream, flags uint32) Result                                          // cuStreamCreate
	StreamDestroy               func(stream Stream) Result                                                         // cuStreamDestroy_v2
	StreamSynchronize           func(stream Stream) Result                                                         // cuStreamSynchronize
	EventCreate                 func(event *Event, flags uint32) Result                                            // cuEventCreate
	EventRecord                 func(event Event, stream Stream) Result                                            // cuEventRecord
	EventQuery                  func(event Event) Result                                                           // cuEventQuery
	EventSynchronize            func(event Event) Result                                                           // cuEventSynchronize
	EventDestroy                func(event Event) Result                                                           // cuEventDestroy_v2
	MemcpyHtoD                  func(dst DevicePtr, src unsafe.Pointer, n uint64) Result                           // cuMemcpyHtoD_v2
	MemcpyDtoH                  func(dst unsafe.Pointer, src DevicePtr, n uint64) Result                           // cuMemcpyDtoH_v2
	MemcpyDtoD                  func(dst, src DevicePtr, n uint64) Result                                          // cuMemcpyDtoD_v2
	MemcpyDtoHAsync             func(dst unsafe.Pointer, src DevicePtr, n uint64, stream Stream) Result            // cuMemcpyDtoHAsync_v2
	GetErrorName                func(code Result, name **byte) Result                                              // cuGetErrorName
}

// Entry names one field of the table: the symbols to try, in order (the
// versioned name first), and a pointer to the func field.
type Entry struct {
	Symbols []string
	Field   any
}

// Entries lists every entry point of t. It is the single list both the loader
// and the tests walk, so a field cannot be forgotten by one of them.
func (t *Table) Entries() []Entry {
	return []Entry{
		{[]string{"cuInit"}, &t.Init},
		{[]string{"cuDeviceGet"}, &t.DeviceGet},
		{[]string{"cuDeviceGetAttribute"}, &t.DeviceGetAttribute},
		{[]string{"cuDevicePrimaryCtxRetain"}, &t.DevicePrimaryCtxRetain},
		{[]string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, &t.DevicePrimaryCtxRelease},
		{[]string{"cuCtxSetCurrent"}, &t.CtxSetCurrent},
		{[]string{"cuMemGetInfo_v2"}, &t.MemGetInfo},
		{[]string{"cuMemAlloc_v2"}, &t.MemAlloc},
		{[]string{"cuMemFree_v2"}, &t.MemFree},
		{[]string{"cuMemsetD8_v2"}, &t.MemsetD8},
		{[]string{"cuMemAddressReserve"}, &t.MemAddressReserve},
		{[]string{"cuMemAddressFree"}, &t.MemAddressFree},
		{[]string{"cuMemCreate"}, &t.MemCreate},
		{[]string{"cuMemRelease"}, &t.MemRelease},
		{[]string{"cuMemMap"}, &t.MemMap},
		{[]string{"cuMemUnmap"}, &t.MemUnmap},
		{[]string{"cuMemSetAccess"}, &t.MemSetAccess},
		{[]string{"cuMemGetAllocationGranularity"}, &t.MemGetAllocationGranularity},
		{[]string{"cuStreamCreate"}, &t.StreamCreate},
		{[]string{"cuStreamDestroy_v2"}, &t.StreamDestroy},
		{[]string{"cuStreamSynchronize"}, &t.StreamSynchronize},
		{[]string{"cuEventCreate"}, &t.EventCreate},
		{[]string{"cuEventRecord"}, &t.EventRecord},
		{[]string{"cuEventQuery"}, &t.EventQuery},
		{[]string{"cuEventSynchronize"}, &t.EventSynchronize},
		{[]string{"cuEventDestroy_v2"}, &t.EventDestroy},
		{[]string{"cuMemcpyHtoD_v2"}, &t.MemcpyHtoD},
		{[]string{"cuMemcpyDtoH_v2"}, &t.MemcpyDtoH},
		{[]string{"cuMemcpyDtoD_v2"}, &t.MemcpyDtoD},
		{[]string{"cuMemcpyDtoHAsync_v2"}, &t.MemcpyDtoHAsync},
		{[]string{"cuGetErrorName"}, &t.GetErrorName},
	}
}

// ErrorName asks the driver for code's name (cuGetErrorName), falling back to
// this package's names when the driver does not know it.
func (t *Table) ErrorName(code Result) string {
	if t != nil && t.GetErrorName != nil {
		var p *byte
		if t.GetErrorName(code, &p) == Success && p != nil {
			if s := GoString(p); s != "" {
				return s
			}
		}
	}
	return code.String()
}

// maxCString bounds how far GoString reads: CUDA error names are short.
const maxCString = 128

// GoString copies the NUL-terminated C string at p (at most 128 bytes).
func GoString(p *byte) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; i < maxCString; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
