package cuda

import (
	"context"
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// A sticky fault of the device's work (CUDA_ERROR_ILLEGAL_ADDRESS) completes
// the fences it covers with the error, of kind ErrUnavailable, by polling and
// by blocking; Synchronize reports it; and every later operation fails with
// ErrUnavailable, including one the pool could have served without the driver.
func TestStickyFaultFailsTyped(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{ManualEvents: true, Granularity: 64 << 10}, Config{})
	g := m.Info().Granularity
	c, err := m.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	s := st.(*Stream)
	polled, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	blocked, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	sim.Fault(driver.ErrIllegalAddress) // a kernel faults
	sim.CompleteEvents()
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var de *DriverError
	if err := polled.Wait(ctx); !errors.Is(err, memapi.ErrUnavailable) || !errors.As(err, &de) || de.Code != driver.ErrIllegalAddress {
		t.Errorf("polled fence after the fault: %v, want ErrUnavailable with CUDA_ERROR_ILLEGAL_ADDRESS", err)
	}
	if err := blocked.Wait(bg); !errors.Is(err, memapi.ErrUnavailable) {
		t.Errorf("blocking fence after the fault: %v, want ErrUnavailable", err)
	}
	if err := s.Synchronize(bg); !errors.Is(err, memapi.ErrUnavailable) {
		t.Errorf("Synchronize after the fault: %v, want ErrUnavailable", err)
	}
	calls := map[string]func() error{
		"Allocate": func() error {
			_, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, grantFor(m))
			return err
		},
		"Reserve": func() error {
			_, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
			return err
		},
		"CreateBacking (pooled)": func() error {
			_, err := m.CreateBacking(bg, g, grantFor(m))
			return err
		},
		"MemInfo": func() error {
			_, _, err := m.MemInfo(bg)
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, memapi.ErrUnavailable) {
			t.Errorf("%s after the fault: %v, want ErrUnavailable", name, err)
		}
	}
	// Closing still closes, and says why the stream's work did not finish.
	if err := s.Close(); !errors.Is(err, memapi.ErrUnavailable) {
		t.Errorf("Stream.Close after the fault: %v, want ErrUnavailable", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Context.Close: %v", err)
	}
}
