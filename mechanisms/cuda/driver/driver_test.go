package driver

import (
	"errors"
	"testing"
)

func TestOpenMissingLibrary(t *testing.T) {
	_, err := OpenLibrary("libmemgen-no-such-library.so.1")
	var le *LoadError
	if !errors.As(err, &le) || le.Symbol != "" || le.Library != "libmemgen-no-such-library.so.1" {
		t.Fatalf("OpenLibrary of a missing library: %v", err)
	}
}

// A library that is not the driver is refused at its first missing symbol,
// without purego's panic.
func TestOpenWrongLibrary(t *testing.T) {
	_, err := OpenLibrary("libc.so.6")
	var le *LoadError
	if !errors.As(err, &le) || le.Symbol != "cuInit" {
		t.Fatalf("OpenLibrary(libc.so.6): %v", err)
	}
}

func TestResultNames(t *testing.T) {
	if got := ErrOutOfMemory.String(); got != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Errorf("String = %q", got)
	}
	if _, ok := Result(12345).Name(); ok {
		t.Error("an unknown code has a name")
	}
	var tbl *Table
	if got := tbl.ErrorName(ErrNotReady); got != "CUDA_ERROR_NOT_READY" {
		t.Errorf("ErrorName without a driver = %q", got)
	}
	b := []byte("CUDA_SUCCESS\x00junk")
	if got := GoString(&b[0]); got != "CUDA_SUCCESS" {
		t.Errorf("GoString = %q", got)
	}
}

func TestDeviceProp(t *testing.T) {
	p := DeviceProp(3)
	if p.Type != MemAllocationTypePinned || p.Location != (MemLocation{Type: MemLocationTypeDevice, ID: 3}) || p.RequestedHandleTypes != MemHandleTypeNone {
		t.Errorf("DeviceProp(3) = %+v", p)
	}
}
