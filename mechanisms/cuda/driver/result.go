package driver

import "strconv"

// Result is a CUresult, the status every driver entry point returns.
type Result int32

// The CUresult codes the binding and the simulator use, with cuda.h's values.
const (
	Success              Result = 0   // CUDA_SUCCESS
	ErrInvalidValue      Result = 1   // CUDA_ERROR_INVALID_VALUE
	ErrOutOfMemory       Result = 2   // CUDA_ERROR_OUT_OF_MEMORY
	ErrNotInitialized    Result = 3   // CUDA_ERROR_NOT_INITIALIZED
	ErrDeinitialized     Result = 4   // CUDA_ERROR_DEINITIALIZED
	ErrStubLibrary       Result = 34  // CUDA_ERROR_STUB_LIBRARY
	ErrInsufficientDrv   Result = 35  // CUDA_ERROR_INSUFFICIENT_DRIVER
	ErrDeviceUnavailable Result = 46  // CUDA_ERROR_DEVICE_UNAVAILABLE
	ErrNoDevice          Result = 100 // CUDA_ERROR_NO_DEVICE
	ErrInvalidDevice     Result = 101 // CUDA_ERROR_INVALID_DEVICE
	ErrInvalidContext    Result = 201 // CUDA_ERROR_INVALID_CONTEXT
	ErrInvalidHandle     Result = 400 // CUDA_ERROR_INVALID_HANDLE
	ErrNotReady          Result = 600 // CUDA_ERROR_NOT_READY
	ErrIllegalAddress    Result = 700 // CUDA_ERROR_ILLEGAL_ADDRESS
	ErrLaunchTimeout     Result = 702 // CUDA_ERROR_LAUNCH_TIMEOUT
	ErrAssert            Result = 710 // CUDA_ERROR_ASSERT
	ErrNotSupported      Result = 801 // CUDA_ERROR_NOT_SUPPORTED
	ErrUnknown           Result = 999 // CUDA_ERROR_UNKNOWN
)

var resultNames = map[Result]string{
	Success:              "CUDA_SUCCESS",
	ErrInvalidValue:      "CUDA_ERROR_INVALID_VALUE",
	ErrOutOfMemory:       "CUDA_ERROR_OUT_OF_MEMORY",
	ErrNotInitialized:    "CUDA_ERROR_NOT_INITIALIZED",
	ErrDeinitialized:     "CUDA_ERROR_DEINITIALIZED",
	ErrStubLibrary:       "CUDA_ERROR_STUB_LIBRARY",
	ErrInsufficientDrv:   "CUDA_ERROR_INSUFFICIENT_DRIVER",
	ErrDeviceUnavailable: "CUDA_ERROR_DEVICE_UNAVAILABLE",
	ErrNoDevice:          "CUDA_ERROR_NO_DEVICE",
	ErrInvalidDevice:     "CUDA_ERROR_INVALID_DEVICE",
	ErrInvalidContext:    "CUDA_ERROR_INVALID_CONTEXT",
	ErrInvalidHandle:     "CUDA_ERROR_INVALID_HANDLE",
	ErrNotReady:          "CUDA_ERROR_NOT_READY",
	ErrIllegalAddress:    "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrLaunchTimeout:     "CUDA_ERROR_LAUNCH_TIMEOUT",
	ErrAssert:            "CUDA_ERROR_ASSERT",
	ErrNotSupported:      "CUDA_ERROR_NOT_SUPPORTED",
	ErrUnknown:           "CUDA_ERROR_UNKNOWN",
}

// Name returns the code's cuda.h name as known to this package, and false
// for a code it does not know (the driver's cuGetErrorName knows them all).
func (r Result) Name() (string, bool) {
	n, ok := resultNames[r]
	return n, ok
}

// Error returns the code's name, as String: a Result is an error, so that a
// fault injector's rule can carry one (memapi.Fail(driver.ErrOutOfMemory)
// makes the simulator's entry point return CUDA_ERROR_OUT_OF_MEMORY).
func (r Result) Error() string { return r.String() }

func (r Result) String() string {
	if n, ok := resultNames[r]; ok {
		return n
	}
	return "CUresult(" + strconv.Itoa(int(r)) + ")"
}
