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

// Sticky covers every code cuda.h documents as leaving the context unusable
// ("the context cannot be used anymore", or "any further CUDA work will
// return the same error"), and no other.
func TestStickyCodes(t *testing.T) {
	sticky := []driver.Result{700, 702, 710, 714, 715, 716, 717, 718, 719}
	notSticky := []driver.Result{0, 1, 2, 4, 201, 400, 600, 701, 709, 711, 713, 720, 801, 999}
	for _, c := range sticky {
		if !Sticky(c) {
			t.Errorf("Sticky(%d) = false, want true", c)
		}
	}
	for _, c := range notSticky {
		if Sticky(c) {
			t.Errorf("Sticky(%d) = true, want false", c)
		}
	}
}

// A kernel that times out (CUDA_ERROR_LAUNCH_TIMEOUT, 702) or fails a device
// assert (CUDA_ERROR_ASSERT, 710) loses the context like an illegal address:
// the mechanism refuses what the pool could still have served.
func TestStickyLaunchCodesLoseTheContext(t *testing.T) {
	simOnly(t)
	for _, code := range []driver.Result{702, 710} {
		t.Run(code.String(), func(t *testing.T) {
			m, sim := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{})
			c, err := m.NewContext()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			s := st.(*Stream)
			defer func() {
				if err := s.Close(); !errors.Is(err, memapi.ErrUnavailable) {
					t.Errorf("Stream.Close after the fault: %v, want ErrUnavailable", err)
				}
			}()
			sim.Fault(code)
			err = s.Synchronize(bg)
			var de *DriverError
			if !errors.As(err, &de) || de.Code != code || !errors.Is(err, memapi.ErrUnavailable) {
				t.Fatalf("Synchronize after the fault: %v, want ErrUnavailable with code %d", err, code)
			}
			creates := sim.Calls("cuMemCreate")
			if _, err := m.CreateBacking(bg, m.Info().Granularity, grantFor(m)); !errors.Is(err, memapi.ErrUnavailable) {
				t.Errorf("CreateBacking (pooled) after code %d: %v, want ErrUnavailable", code, err)
			}
			if n := sim.Calls("cuMemCreate"); n != creates {
				t.Errorf("cuMemCreate called %d times after the context was lost", n-creates)
			}
		})
	}
}
