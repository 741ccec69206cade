package driver

import "unsafe"

// The driver's handle types. Pointers the driver owns (contexts, streams,
// events) are uintptr: Go never dereferences them.
type (
	Device     int32   // CUdevice
	Context    uintptr // CUcontext
	DevicePtr  uint64  // CUdeviceptr
	MemHandle  uint64  // CUmemGenericAllocationHandle
	Stream     uintptr // CUstream
	Event      uintptr // CUevent
	DeviceAttr int32   // CUdevice_attribute
)

// Device attributes the mechanism reads.
const (
	// AttrVirtualMemoryManagementSupported is
	// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: 1 when the device
	// supports cuMemAddressReserve, cuMemCreate, cuMemMap and friends.
	AttrVirtualMemoryManagementSupported DeviceAttr = 102
)

// Enumerations of the VMM calls (cuda.h values).
const (
	MemAllocationTypePinned int32 = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	MemLocationTypeDevice   int32 = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	MemHandleTypeNone       int32 = 0 // CU_MEM_HANDLE_TYPE_NONE

	MemAccessProtNone      int32 = 0 // CU_MEM_ACCESS_FLAGS_PROT_NONE
	MemAccessProtRead      int32 = 1 // CU_MEM_ACCESS_FLAGS_PROT_READ
	MemAccessProtReadWrite int32 = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE

	MemAllocGranularityMinimum     int32 = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	MemAllocGranularityRecommended int32 = 1 // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
)

// Stream and event creation flags.
const (
	StreamDefault      uint32 = 0 // CU_STREAM_DEFAULT: synchronizes with the legacy default stream
	StreamNonBlocking  uint32 = 1 // CU_STREAM_NON_BLOCKING: may run concurrently with the legacy default stream
	EventDisableTiming uint32 = 2 // CU_EVENT_DISABLE_TIMING: the cheapest event, for ordering only
	// eventFlagsKnownMask is every CUevent_flags bit of cuda.h:
	// CU_EVENT_BLOCKING_SYNC (1), CU_EVENT_DISABLE_TIMING (2) and
	// CU_EVENT_INTERPROCESS (4). 0x8 is no cuEventCreate flag.
	eventFlagsKnownMask = 1 | EventDisableTiming | 4
)

// EventFlagsValid reports whether flags holds only CU_EVENT_* bits.
func EventFlagsValid(flags uint32) bool { return flags&^eventFlagsKnownMask == 0 }

// MemLocation is CUmemLocation: {CUmemLocationType type; int id}.
type MemLocation struct {
	Type int32
	ID   int32
}

// MemAllocationProp is CUmemAllocationProp (CUDA 11.x/12.x layout, 32 bytes):
// type, requestedHandleTypes, location, win32HandleMetaData, allocFlags.
type MemAllocationProp struct {
	Type                 int32
	RequestedHandleTypes int32
	Location             MemLocation
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// MemAccessDesc is CUmemAccessDesc: {CUmemLocation location; CUmemAccess_flags flags}, 12 bytes.
type MemAccessDesc struct {
	Location MemLocation
	Flags    int32
}

// Compile-time checks that the Go layouts match cuda.h: a size mismatch makes
// these array conversions fail to compile.
var (
	_ [32]byte = [unsafe.Sizeof(MemAllocationProp{})]byte{}
	_ [12]byte = [unsafe.Sizeof(MemAccessDesc{})]byte{}
	_ [8]byte  = [unsafe.Sizeof(MemLocation{})]byte{}
	_ [16]byte = [unsafe.Offsetof(MemAllocationProp{}.Win32HandleMetaData)]byte{}
	_ [24]byte = [unsafe.Offsetof(MemAllocationProp{}.CompressionType)]byte{}
)

// DeviceProp returns the allocation properties of pinned device memory on
// device dev with no exportable handle type: what cuMemCreate and
// cuMemGetAllocationGranularity are given.
func DeviceProp(dev Device) MemAllocationProp {
	return MemAllocationProp{
		Type:                 MemAllocationTypePinned,
		RequestedHandleTypes: MemHandleTypeNone,
		Location:             MemLocation{Type: MemLocationTypeDevice, ID: int32(dev)},
	}
}
