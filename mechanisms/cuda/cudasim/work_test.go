package cudasim

import (
	"bytes"
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Memsets and device copies complete later, in order: pending until
// something waits, then visible to a read (which waits for them).
func TestWorkCompletesLater(t *testing.T) {
	e := setup(t, Config{})
	a, _ := e.mapped(g, driver.MemAccessProtReadWrite)
	b, _ := e.mapped(g, driver.MemAccessProtReadWrite)
	e.must("cuMemsetD8", e.d.MemsetD8(a, 7, 64))
	e.must("cuMemcpyDtoD", e.d.MemcpyDtoD(b, a, 64))
	if n := e.s.Stats().PendingWork; n != 2 {
		t.Fatalf("PendingWork = %d after a memset and a copy, want 2", n)
	}
	got, r := e.read(b, 64)
	e.must("cuMemcpyDtoH", r)
	if !bytes.Equal(got, bytes.Repeat([]byte{7}, 64)) {
		t.Errorf("read after the queued work: %v", got[:8])
	}
	if n := e.s.Stats().PendingWork; n != 0 {
		t.Errorf("PendingWork = %d after a synchronous read", n)
	}
}

// Unmapping memory that pending work touches is a fault at the next wait.
func TestUnmapUnderPendingWork(t *testing.T) {
	for _, synced := range []bool{false, true} {
		e := setup(t, Config{})
		p, h := e.mapped(g, driver.MemAccessProtReadWrite)
		e.must("cuMemsetD8", e.d.MemsetD8(p, 0, g))
		if synced {
			e.must("cuStreamSynchronize", e.d.StreamSynchronize(0))
		}
		e.must("cuMemUnmap", e.d.MemUnmap(p, g)) // the driver does not refuse it
		e.must("cuMemRelease", e.d.MemRelease(h))
		r := e.d.StreamSynchronize(0)
		if want := map[bool]driver.Result{false: driver.ErrIllegalAddress, true: driver.Success}[synced]; r != want {
			t.Errorf("synchronized before unmap %v: cuStreamSynchronize = %v, want %v", synced, r, want)
		}
	}
}

// Faults surface where the host waits: an event query, an event or stream
// synchronize; then every call that needs the context fails with them.
func TestFaultSurfacesAtWait(t *testing.T) {
	waits := map[string]func(e *env, ev driver.Event) driver.Result{
		"cuEventQuery":        func(e *env, ev driver.Event) driver.Result { return e.d.EventQuery(ev) },
		"cuEventSynchronize":  func(e *env, ev driver.Event) driver.Result { return e.d.EventSynchronize(ev) },
		"cuStreamSynchronize": func(e *env, _ driver.Event) driver.Result { return e.d.StreamSynchronize(0) },
	}
	for name, wait := range waits {
		e := setup(t, Config{})
		var ev driver.Event
		e.must("cuEventCreate", e.d.EventCreate(&ev, driver.EventDisableTiming))
		e.s.Fault(driver.ErrIllegalAddress)
		e.must("cuEventRecord", e.d.EventRecord(ev, 0)) // the fault is not seen at the call
		if r := wait(e, ev); r != driver.ErrIllegalAddress {
			t.Errorf("%s after a fault = %v, want CUDA_ERROR_ILLEGAL_ADDRESS", name, r)
		}
		var q driver.DevicePtr
		if r := e.d.MemAlloc(&q, 4096); r != driver.ErrIllegalAddress {
			t.Errorf("%s: cuMemAlloc after the fault = %v, want the sticky code", name, r)
		}
	}
}

// In manual mode work stays pending until the test completes the events.
func TestManualModeHoldsWork(t *testing.T) {
	e := setup(t, Config{ManualEvents: true})
	p, _ := e.mapped(g, driver.MemAccessProtReadWrite)
	var ev driver.Event
	e.must("cuEventCreate", e.d.EventCreate(&ev, driver.EventDisableTiming))
	e.must("cuMemsetD8", e.d.MemsetD8(p, 1, 16))
	e.must("cuEventRecord", e.d.EventRecord(ev, 0))
	if r := e.d.EventQuery(ev); r != driver.ErrNotReady {
		t.Fatalf("cuEventQuery = %v, want NOT_READY", r)
	}
	if st := e.s.Stats(); st.PendingWork != 1 {
		t.Fatalf("PendingWork = %d", st.PendingWork)
	}
	e.s.CompleteEvents()
	if r := e.d.EventQuery(ev); r != driver.Success || e.s.Stats().PendingWork != 0 {
		t.Errorf("after CompleteEvents: query %v, pending %d", r, e.s.Stats().PendingWork)
	}
}
