package cuda

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Opening a device makes its primary context current before any call that a
// driver may want a context for: the granularity query comes after
// cuCtxSetCurrent (the simulator refuses it without a context, as a driver
// may), and when it fails the context is released again.
func TestDeviceOpenOrder(t *testing.T) {
	simOnly(t)
	sim := cudasim.New(cudasim.Config{})
	tbl := sim.Table()
	var mu sync.Mutex
	var order []string
	note := func(call string) {
		mu.Lock()
		order = append(order, call)
		mu.Unlock()
	}
	setCurrent, gran := tbl.CtxSetCurrent, tbl.MemGetAllocationGranularity
	tbl.CtxSetCurrent = func(ctx driver.Context) driver.Result {
		if ctx != 0 {
			note("cuCtxSetCurrent")
		}
		return setCurrent(ctx)
	}
	tbl.MemGetAllocationGranularity = func(g *uint64, prop *driver.MemAllocationProp, option int32) driver.Result {
		note("cuMemGetAllocationGranularity")
		return gran(g, prop, option)
	}
	m, err := New(Config{Driver: tbl})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	want := []string{"cuCtxSetCurrent", "cuMemGetAllocationGranularity"}
	if !slices.Equal(order, want) {
		t.Errorf("calls in order %v, want %v", order, want)
	}

	sim = cudasim.New(cudasim.Config{})
	sim.FailCall("cuMemGetAllocationGranularity", 1, driver.ErrUnknown)
	if _, err := New(Config{Driver: sim.Table()}); !errors.Is(err, memapi.ErrUnavailable) {
		t.Fatalf("New with the granularity query failing: %v, want ErrUnavailable", err)
	}
	if st := sim.Stats(); st.ContextRefs != 0 {
		t.Errorf("a failed granularity query left %d context references", st.ContextRefs)
	}
}
