package cuda

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// This machine has no libcuda.so.1: New must say so with a typed error.
func TestUnavailableWithoutLibrary(t *testing.T) {
	if realDriver() {
		t.Skip("MEMGEN_CUDA=real: the driver is present")
	}
	if _, err := driver.Open(); err == nil {
		t.Skip("libcuda.so.1 loads on this machine")
	}
	m, err := New(Config{})
	if err == nil {
		_ = m.Close()
		t.Fatal("New succeeded without a driver")
	}
	if !errors.Is(err, memapi.ErrUnavailable) {
		t.Errorf("error %q does not match memapi.ErrUnavailable", err)
	}
	var ue *UnavailableError
	if !errors.As(err, &ue) || ue.Reason != NoLibrary {
		t.Fatalf("error %q is not an *UnavailableError with reason NoLibrary", err)
	}
	var le *driver.LoadError
	if !errors.As(err, &le) || le.Library != driver.Library || le.Symbol != "" {
		t.Errorf("cause %#v, want a LoadError for %s", le, driver.Library)
	}
	t.Logf("New on this machine: %v", err)
}

// A library without the CUDA entry points (libc) is refused, naming the
// first missing symbol, without a panic from purego.
func TestUnavailableMissingSymbol(t *testing.T) {
	_, err := driver.OpenLibrary("libc.so.6")
	if err == nil {
		t.Fatal("libc.so.6 bound as a CUDA driver")
	}
	var le *driver.LoadError
	if !errors.As(err, &le) || le.Symbol != "cuInit" {
		t.Fatalf("error %q is not a LoadError for cuInit", err)
	}
	uerr := unavailableLoad(err)
	var ue *UnavailableError
	if !errors.As(uerr, &ue) || ue.Reason != MissingSymbol || !errors.Is(uerr, memapi.ErrUnavailable) {
		t.Errorf("unavailableLoad = %v", uerr)
	}
}

func TestUnavailableFromDriver(t *testing.T) {
	simOnly(t)
	cases := []struct {
		name    string
		cfg     cudasim.Config
		ordinal int
		reason  UnavailableReason
		code    driver.Result
	}{
		{"stub-library", cudasim.Config{Stub: true}, 0, StubLibrary, driver.ErrStubLibrary},
		{"no-device", cudasim.Config{NoDevice: true}, 0, NoDevice, driver.ErrNoDevice},
		{"bad-ordinal", cudasim.Config{}, 3, NoDevice, driver.ErrInvalidDevice},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sim := cudasim.New(tc.cfg)
			m, err := New(Config{Driver: sim.Table(), Ordinal: tc.ordinal})
			if err == nil {
				_ = m.Close()
				t.Fatal("New succeeded")
			}
			var ue *UnavailableError
			if !errors.As(err, &ue) || ue.Reason != tc.reason || !errors.Is(err, memapi.ErrUnavailable) {
				t.Fatalf("New = %v, want reason %v", err, tc.reason)
			}
			var de *DriverError
			wantName, _ := tc.code.Name()
			if !errors.As(err, &de) || de.Code != tc.code || de.Name != wantName {
				t.Errorf("cause %#v, want code %v named %s", de, tc.code, wantName)
			}
			if st := sim.Stats(); st.ContextRefs != 0 {
				t.Errorf("a failed New left %d context references", st.ContextRefs)
			}
		})
	}
}

func TestDriverErrorKinds(t *testing.T) {
	cases := []struct {
		code driver.Result
		kind error
	}{
		{driver.ErrOutOfMemory, memapi.ErrOutOfMemory},
		{driver.ErrInvalidValue, memapi.ErrInvalidRange},
		{driver.ErrIllegalAddress, memapi.ErrUnavailable}, // sticky: the context is lost
		{driver.ErrInvalidHandle, memapi.ErrReleased},
		{driver.ErrInvalidContext, memapi.ErrClosed},
		{driver.ErrNotSupported, memapi.ErrUnsupported},
		{driver.ErrUnknown, memapi.ErrUnavailable},
		{driver.Result(214), memapi.ErrUnavailable}, // CUDA_ERROR_ECC_UNCORRECTABLE
	}
	for _, tc := range cases {
		err := error(&DriverError{Call: "cuX", Code: tc.code, Name: tc.code.String()})
		if !errors.Is(err, tc.kind) {
			t.Errorf("code %v: %v does not match %v", tc.code, err, tc.kind)
		}
	}
	if Kind("cuInit", driver.Success) != nil {
		t.Error("Kind(CUDA_SUCCESS) is not nil")
	}
	e := &DriverError{Call: "cuMemCreate", Code: driver.ErrOutOfMemory, Name: "CUDA_ERROR_OUT_OF_MEMORY"}
	if got, want := e.Error(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// CUDA_ERROR_INVALID_VALUE means what the call was given: a size the driver
// will not serve, a handle it does not know, flags it does not take, or a
// bad range. The error's kind says which, per call.
func TestInvalidValueKindPerCall(t *testing.T) {
	cases := []struct {
		call string
		kind error
	}{
		{"cuMemAlloc_v2", memapi.ErrInvalidSize},
		{"cuMemCreate", memapi.ErrInvalidSize},
		{"cuMemAddressReserve", memapi.ErrInvalidSize},
		{"cuMemFree_v2", memapi.ErrReleased},
		{"cuMemRelease", memapi.ErrReleased},
		{"cuStreamCreate", memapi.ErrUnsupported},
		{"cuEventCreate", memapi.ErrUnsupported},
		{"cuMemGetAllocationGranularity", memapi.ErrUnsupported},
		{"cuMemMap", memapi.ErrInvalidRange},
		{"cuMemUnmap", memapi.ErrInvalidRange},
		{"cuMemSetAccess", memapi.ErrInvalidRange},
		{"cuMemAddressFree", memapi.ErrInvalidRange},
		{"cuMemsetD8_v2", memapi.ErrInvalidRange},
		{"cuMemcpyHtoD_v2", memapi.ErrInvalidRange},
	}
	for _, tc := range cases {
		err := error(&DriverError{Call: tc.call, Code: driver.ErrInvalidValue, Name: "CUDA_ERROR_INVALID_VALUE"})
		if !errors.Is(err, tc.kind) {
			t.Errorf("%v: kind %v", err, tc.kind)
		}
	}
	if realDriver() {
		return
	}
	// Through the mechanism: the driver refuses a size, and a stream's flags.
	m, sim := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{})
	g := m.Info().Granularity
	sim.FailCall("cuMemCreate", 1, driver.ErrInvalidValue)
	if _, err := m.CreateBacking(bg, 2*g, grantFor(m)); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("CreateBacking refused by cuMemCreate: %v, want ErrInvalidSize", err)
	}
	sim.FailCall("cuMemAddressReserve", 1, driver.ErrInvalidValue)
	if _, err := m.Reserve(bg, memapi.ReserveRequest{Size: g}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("Reserve refused by cuMemAddressReserve: %v, want ErrInvalidSize", err)
	}
	sim.FailCall("cuMemAlloc", 1, driver.ErrInvalidValue)
	if _, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, grantFor(m)); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("Allocate refused by cuMemAlloc: %v, want ErrInvalidSize", err)
	}
	c, err := m.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sim.FailCall("cuStreamCreate", 1, driver.ErrInvalidValue)
	if _, err := c.NewStream(); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("NewStream refused by cuStreamCreate: %v, want ErrUnsupported", err)
	}
}
