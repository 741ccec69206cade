package cuda

import (
	"errors"
	"fmt"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// DriverError is a CUresult other than CUDA_SUCCESS: the entry point that
// returned it, the code and the code's name from cuGetErrorName. It wraps the
// memapi sentinel the code means (see Kind), so errors.Is works on it.
type DriverError struct {
	Call string        // the C entry point, e.g. "cuMemCreate"
	Code driver.Result // the CUresult
	Name string        // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, int32(e.Code))
}

// Unwrap returns the memapi sentinel of the code for the call.
func (e *DriverError) Unwrap() error { return Kind(e.Call, e.Code) }

// Kind maps a CUresult returned by call (its C name, with or without a
// version suffix) to the memapi sentinel it means:
//
//	CUDA_ERROR_OUT_OF_MEMORY (2)                    ErrOutOfMemory
//	CUDA_ERROR_INVALID_VALUE (1)                    per call, see below
//	CUDA_ERROR_INVALID_HANDLE (400)                 ErrReleased
//	CUDA_ERROR_INVALID_CONTEXT (201), DEINITIALIZED (4)  ErrClosed
//	CUDA_ERROR_NOT_SUPPORTED (801)                  ErrUnsupported
//	anything else (no device, stub library, ECC, the sticky codes of
//	Sticky, unknown)                                ErrUnavailable
//
// CUDA_ERROR_INVALID_VALUE says that an argument was refused, and which one
// depends on the call: a size the driver will not serve (cuMemAlloc,
// cuMemCreate, cuMemAddressReserve: ErrInvalidSize), a pointer or handle it
// does not know (cuMemFree, cuMemRelease: ErrReleased), flags or options it
// does not take (cuInit, cuStreamCreate, cuEventCreate,
// cuMemGetAllocationGranularity, cuDeviceGetAttribute: ErrUnsupported), and
// otherwise an address range (cuMemMap, cuMemUnmap, cuMemSetAccess,
// cuMemAddressFree, the copies and memsets: ErrInvalidRange).
//
// A code in the last group means the device cannot be trusted to serve.
// CUDA_ERROR_ILLEGAL_ADDRESS in particular is sticky: cuda.h says "the
// process is in an inconsistent state and any further CUDA work will return
// the same error", so it is not a bad range of this call but a lost context.
func Kind(call string, code driver.Result) error {
	switch code {
	case driver.Success:
		return nil
	case driver.ErrOutOfMemory:
		return memapi.ErrOutOfMemory
	case driver.ErrInvalidValue:
		if k, ok := invalidValueKinds[strings.TrimSuffix(call, "_v2")]; ok {
			return k
		}
		return memapi.ErrInvalidRange
	case driver.ErrInvalidHandle:
		return memapi.ErrReleased
	case driver.ErrInvalidContext, driver.ErrDeinitialized:
		return memapi.ErrClosed
	case driver.ErrNotSupported:
		return memapi.ErrUnsupported
	}
	return memapi.ErrUnavailable
}

// invalidValueKinds is what CUDA_ERROR_INVALID_VALUE means for the calls
// where it is not a bad address range.
var invalidValueKinds = map[string]error{
	"cuMemAlloc":                    memapi.ErrInvalidSize,
	"cuMemCreate":                   memapi.ErrInvalidSize,
	"cuMemAddressReserve":           memapi.ErrInvalidSize,
	"cuMemFree":                     memapi.ErrReleased,
	"cuMemRelease":                  memapi.ErrReleased,
	"cuInit":                        memapi.ErrUnsupported,
	"cuStreamCreate":                memapi.ErrUnsupported,
	"cuEventCreate":                 memapi.ErrUnsupported,
	"cuMemGetAllocationGranularity": memapi.ErrUnsupported,
	"cuDeviceGetAttribute":          memapi.ErrUnsupported,
}

// Sticky reports whether code is one of the errors cuda.h documents as
// leaving the context unusable: CUDA_ERROR_ILLEGAL_ADDRESS (700),
// HARDWARE_STACK_ERROR (714), ILLEGAL_INSTRUCTION (715), MISALIGNED_ADDRESS
// (716), INVALID_ADDRESS_SPACE (717), INVALID_PC (718) and LAUNCH_FAILED
// (719), after which "the process ... in an inconsistent state" and "any
// further CUDA work will return the same error"; and LAUNCH_TIMEOUT (702)
// and ASSERT (710), after which "the context cannot be used anymore".
func Sticky(code driver.Result) bool {
	switch code {
	case driver.ErrIllegalAddress, driver.ErrLaunchTimeout, driver.ErrAssert:
		return true
	}
	return code >= 714 && code <= 719
}

// check turns a CUresult into nil or a *DriverError named by the driver. It
// runs on the device thread (cuGetErrorName is a driver call too).
func check(t *driver.Table, call string, r driver.Result) error {
	if r == driver.Success {
		return nil
	}
	return &DriverError{Call: call, Code: r, Name: t.ErrorName(r)}
}

// UnavailableReason says why the CUDA mechanism cannot run on this machine.
type UnavailableReason uint8

const (
	// NoLibrary: libcuda.so.1 could not be opened (no NVIDIA driver installed).
	NoLibrary UnavailableReason = iota + 1
	// MissingSymbol: the library lacks an entry point the mechanism needs (driver too old).
	MissingSymbol
	// StubLibrary: cuInit returned CUDA_ERROR_STUB_LIBRARY (the toolkit's stub libcuda, not a driver).
	StubLibrary
	// NoDevice: cuInit returned CUDA_ERROR_NO_DEVICE, or the ordinal names no device.
	NoDevice
	// DriverFailure: the driver failed while the device was being opened.
	DriverFailure
)

func (r UnavailableReason) String() string {
	switch r {
	case NoLibrary:
		return "no driver library"
	case MissingSymbol:
		return "driver library lacks a symbol"
	case StubLibrary:
		return "stub driver library"
	case NoDevice:
		return "no CUDA device"
	case DriverFailure:
		return "driver failure"
	}
	return fmt.Sprintf("UnavailableReason(%d)", uint8(r))
}

// UnavailableError is what New returns when CUDA cannot run here. It matches
// memapi.ErrUnavailable with errors.Is, and its cause (a *driver.LoadError or
// a *DriverError) with errors.As.
type UnavailableError struct {
	Reason UnavailableReason
	Detail string
	Err    error
}

func (e *UnavailableError) Error() string {
	s := "cuda: unavailable: " + e.Reason.String()
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns memapi.ErrUnavailable and the cause.
func (e *UnavailableError) Unwrap() []error { return []error{memapi.ErrUnavailable, e.Err} }

// unavailableLoad classifies a failure to bind the library.
func unavailableLoad(err error) error {
	var le *driver.LoadError
	if errors.As(err, &le) && le.Symbol != "" {
		return &UnavailableError{Reason: MissingSymbol, Detail: le.Symbol, Err: err}
	}
	return &UnavailableError{Reason: NoLibrary, Detail: driver.Library, Err: err}
}

// unavailableInit classifies a driver error met while opening the device.
func unavailableInit(err error) error {
	var de *DriverError
	if errors.As(err, &de) {
		switch de.Code {
		case driver.ErrStubLibrary:
			return &UnavailableError{Reason: StubLibrary, Detail: "cuInit", Err: err}
		case driver.ErrNoDevice, driver.ErrInvalidDevice:
			return &UnavailableError{Reason: NoDevice, Detail: de.Call, Err: err}
		}
	}
	return &UnavailableError{Reason: DriverFailure, Err: err}
}
