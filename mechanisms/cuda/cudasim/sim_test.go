package cudasim

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

const g = 2 << 20 // the default granularity

// env is a simulator with the calling test goroutine locked to its OS thread
// and the primary context of device 0 current there, as the mechanism's
// device thread has it.
type env struct {
	t   *testing.T
	s   *Sim
	d   *driver.Table
	ctx driver.Context
}

func setup(t *testing.T, cfg Config) *env {
	t.Helper()
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	s := New(cfg)
	e := &env{t: t, s: s, d: s.Table()}
	e.must("cuInit", e.d.Init(0))
	e.must("cuDevicePrimaryCtxRetain", e.d.DevicePrimaryCtxRetain(&e.ctx, 0))
	e.must("cuCtxSetCurrent", e.d.CtxSetCurrent(e.ctx))
	t.Cleanup(func() { _ = e.d.CtxSetCurrent(0) })
	return e
}

func (e *env) must(call string, r driver.Result) {
	e.t.Helper()
	if r != driver.Success {
		e.t.Fatalf("%s: %v", call, r)
	}
}

// reserve reserves size bytes aligned to the granularity (the default
// alignment is only the host page: see memAddressReserve).
func (e *env) reserve(size uint64) driver.DevicePtr {
	e.t.Helper()
	var p driver.DevicePtr
	e.must("cuMemAddressReserve", e.d.MemAddressReserve(&p, size, e.s.cfg.Granularity, 0, 0))
	return p
}

func (e *env) create(size uint64) driver.MemHandle {
	e.t.Helper()
	var h driver.MemHandle
	prop := driver.DeviceProp(0)
	e.must("cuMemCreate", e.d.MemCreate(&h, size, &prop, 0))
	return h
}

func (e *env) access(p driver.DevicePtr, size uint64, flags int32) driver.Result {
	desc := driver.MemAccessDesc{Location: driver.MemLocation{Type: driver.MemLocationTypeDevice, ID: 0}, Flags: flags}
	return e.d.MemSetAccess(p, size, &desc, 1)
}

// mapped reserves size bytes, maps one new handle over them and sets flags.
func (e *env) mapped(size uint64, flags int32) (driver.DevicePtr, driver.MemHandle) {
	e.t.Helper()
	p := e.reserve(size)
	h := e.create(size)
	e.must("cuMemMap", e.d.MemMap(p, size, 0, h, 0))
	e.must("cuMemSetAccess", e.access(p, size, flags))
	return p, h
}

func (e *env) write(p driver.DevicePtr, b []byte) driver.Result {
	return e.d.MemcpyHtoD(p, unsafe.Pointer(&b[0]), uint64(len(b)))
}

func (e *env) read(p driver.DevicePtr, n int) ([]byte, driver.Result) {
	b := make([]byte, n)
	return b, e.d.MemcpyDtoH(unsafe.Pointer(&b[0]), p, uint64(n))
}

// TestRules breaks each documented rule once and expects the driver's code.
func TestRules(t *testing.T) {
	prop := driver.DeviceProp(0)
	cases := []struct {
		name string
		cfg  Config
		want driver.Result
		run  func(e *env) driver.Result
	}{
		{"alloc/zero-size", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			return e.d.MemAlloc(&p, 0)
		}},
		{"alloc/out-of-memory", Config{Memory: 8 << 20}, driver.ErrOutOfMemory, func(e *env) driver.Result {
			var p driver.DevicePtr
			e.must("cuMemAlloc", e.d.MemAlloc(&p, 6<<20+1)) // charged 8 MiB: whole 2 MiB pages
			return e.d.MemAlloc(&p, 1)
		}},
		{"free/not-a-block-start", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			e.must("cuMemAlloc", e.d.MemAlloc(&p, 4096))
			return e.d.MemFree(p + 256)
		}},
		{"free/twice", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			e.must("cuMemAlloc", e.d.MemAlloc(&p, 4096))
			e.must("cuMemFree", e.d.MemFree(p))
			return e.d.MemFree(p)
		}},
		{"reserve/unaligned-size", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			return e.d.MemAddressReserve(&p, g+100, 0, 0, 0) // not a multiple of the host page
		}},
		{"reserve/host-page-size", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			return e.d.MemAddressReserve(&p, hostPage, 0, 0, 0) // a host page, not a granularity: a GPU refuses it
		}},
		{"reserve/granularity-plus-a-page", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			return e.d.MemAddressReserve(&p, g+hostPage, g, 0, 0)
		}},
		{"reserve/flags", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			return e.d.MemAddressReserve(&p, g, 0, 0, 1)
		}},
		{"create/unaligned-size", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var h driver.MemHandle
			return e.d.MemCreate(&h, g/2, &prop, 0)
		}},
		{"create/not-pinned", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var h driver.MemHandle
			p := prop
			p.Type = 0
			return e.d.MemCreate(&h, g, &p, 0)
		}},
		{"create/bad-device", Config{}, driver.ErrInvalidDevice, func(e *env) driver.Result {
			var h driver.MemHandle
			p := prop
			p.Location.ID = 7
			return e.d.MemCreate(&h, g, &p, 0)
		}},
		{"create/out-of-memory", Config{Memory: 4 << 20}, driver.ErrOutOfMemory, func(e *env) driver.Result {
			e.create(2 * g)
			var h driver.MemHandle
			return e.d.MemCreate(&h, g, &prop, 0)
		}},
		{"granularity/bad-option", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var n uint64
			return e.d.MemGetAllocationGranularity(&n, &prop, 5)
		}},
		{"map/unaligned-address", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(2 * g)
			return e.d.MemMap(p+4096, g, 0, e.create(g), 0)
		}},
		{"map/offset-past-the-handle", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(g)
			return e.d.MemMap(p, g, 2*g, e.create(2*g), 0)
		}},
		{"map/unaligned-offset", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(g)
			return e.d.MemMap(p, g, 4096, e.create(2*g), 0)
		}},
		{"map/outside-any-reservation", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(g)
			return e.d.MemMap(p+g, g, 0, e.create(g), 0) // the gap after the reservation
		}},
		{"map/past-reservation-end", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(g)
			return e.d.MemMap(p, 2*g, 0, e.create(2*g), 0)
		}},
		{"map/over-a-mapping", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(2 * g)
			e.must("cuMemMap", e.d.MemMap(p, g, 0, e.create(g), 0))
			return e.d.MemMap(p, 2*g, 0, e.create(2*g), 0)
		}},
		{"map/longer-than-handle", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(2 * g)
			return e.d.MemMap(p, 2*g, 0, e.create(g), 0)
		}},
		{"map/released-handle", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(g)
			h := e.create(g)
			e.must("cuMemRelease", e.d.MemRelease(h))
			return e.d.MemMap(p, g, 0, h, 0)
		}},
		{"access/unmapped-range", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			return e.access(e.reserve(g), g, driver.MemAccessProtReadWrite)
		}},
		{"access/part-of-a-mapping", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(2 * g)
			e.must("cuMemMap", e.d.MemMap(p, 2*g, 0, e.create(2*g), 0))
			return e.access(p, g, driver.MemAccessProtReadWrite)
		}},
		{"access/bad-flags", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(g)
			e.must("cuMemMap", e.d.MemMap(p, g, 0, e.create(g), 0))
			return e.access(p, g, 2)
		}},
		{"copy/before-set-access", Config{}, driver.ErrIllegalAddress, func(e *env) driver.Result {
			p := e.reserve(g)
			e.must("cuMemMap", e.d.MemMap(p, g, 0, e.create(g), 0))
			e.must("cuMemcpyHtoD", e.write(p, []byte{1})) // a fault is reported by what waits for the work
			return e.d.StreamSynchronize(0)
		}},
		{"copy/read-before-set-access", Config{}, driver.ErrIllegalAddress, func(e *env) driver.Result {
			p := e.reserve(g)
			e.must("cuMemMap", e.d.MemMap(p, g, 0, e.create(g), 0))
			_, r := e.read(p, 1)
			return r
		}},
		{"copy/write-through-prot-read", Config{}, driver.ErrIllegalAddress, func(e *env) driver.Result {
			p, _ := e.mapped(g, driver.MemAccessProtRead)
			e.must("cuMemcpyHtoD", e.write(p, []byte{1}))
			return e.d.StreamSynchronize(0)
		}},
		{"copy/dtod-into-prot-read", Config{}, driver.ErrIllegalAddress, func(e *env) driver.Result {
			src, _ := e.mapped(g, driver.MemAccessProtReadWrite)
			dst, _ := e.mapped(g, driver.MemAccessProtRead)
			e.must("cuMemcpyDtoD", e.d.MemcpyDtoD(dst, src, 16))
			return e.d.StreamSynchronize(0)
		}},
		{"copy/unmapped-address", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			return e.write(e.reserve(g), []byte{1})
		}},
		{"copy/across-a-hole", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(2 * g)
			e.must("cuMemMap", e.d.MemMap(p, g, 0, e.create(g), 0))
			e.must("cuMemSetAccess", e.access(p, g, driver.MemAccessProtReadWrite))
			return e.write(p+g-8, make([]byte, 16))
		}},
		{"copy/past-a-block", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			e.must("cuMemAlloc", e.d.MemAlloc(&p, 4096))
			return e.write(p+4000, make([]byte, 200))
		}},
		{"copy/freed-block", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var p driver.DevicePtr
			e.must("cuMemAlloc", e.d.MemAlloc(&p, 4096))
			e.must("cuMemFree", e.d.MemFree(p))
			return e.write(p, []byte{1})
		}},
		{"unmap/part-of-a-mapping", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p, _ := e.mapped(2*g, driver.MemAccessProtReadWrite)
			return e.d.MemUnmap(p, g)
		}},
		{"unmap/two-mappings-at-once", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p := e.reserve(2 * g)
			e.must("cuMemMap", e.d.MemMap(p, g, 0, e.create(g), 0))
			e.must("cuMemMap", e.d.MemMap(p+g, g, 0, e.create(g), 0))
			return e.d.MemUnmap(p, 2*g)
		}},
		{"unmap/nothing-mapped", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			return e.d.MemUnmap(e.reserve(g), g)
		}},
		{"release/twice", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			h := e.create(g)
			e.must("cuMemRelease", e.d.MemRelease(h))
			return e.d.MemRelease(h)
		}},
		{"address-free/with-mappings", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			p, _ := e.mapped(g, driver.MemAccessProtReadWrite)
			return e.d.MemAddressFree(p, g)
		}},
		{"address-free/not-a-whole-reservation", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			return e.d.MemAddressFree(e.reserve(2*g), g)
		}},
		{"no-vmm/reserve", Config{NoVMM: true}, driver.ErrNotSupported, func(e *env) driver.Result {
			var p driver.DevicePtr
			return e.d.MemAddressReserve(&p, g, 0, 0, 0)
		}},
		{"no-vmm/create", Config{NoVMM: true}, driver.ErrNotSupported, func(e *env) driver.Result {
			var h driver.MemHandle
			return e.d.MemCreate(&h, g, &prop, 0)
		}},
		{"no-vmm/granularity", Config{NoVMM: true}, driver.ErrNotSupported, func(e *env) driver.Result {
			var n uint64
			return e.d.MemGetAllocationGranularity(&n, &prop, 0)
		}},
		{"stream/unknown", Config{}, driver.ErrInvalidHandle, func(e *env) driver.Result {
			return e.d.StreamSynchronize(12345)
		}},
		{"stream/destroyed", Config{}, driver.ErrInvalidHandle, func(e *env) driver.Result {
			var s driver.Stream
			e.must("cuStreamCreate", e.d.StreamCreate(&s, 0))
			e.must("cuStreamDestroy", e.d.StreamDestroy(s))
			return e.d.StreamDestroy(s)
		}},
		{"event/unknown", Config{}, driver.ErrInvalidHandle, func(e *env) driver.Result {
			return e.d.EventQuery(12345)
		}},
		{"event/record-on-unknown-stream", Config{}, driver.ErrInvalidHandle, func(e *env) driver.Result {
			var ev driver.Event
			e.must("cuEventCreate", e.d.EventCreate(&ev, driver.EventDisableTiming))
			return e.d.EventRecord(ev, 999)
		}},
		{"event/pending-in-manual-mode", Config{ManualEvents: true}, driver.ErrNotReady, func(e *env) driver.Result {
			var ev driver.Event
			e.must("cuEventCreate", e.d.EventCreate(&ev, driver.EventDisableTiming))
			e.must("cuEventRecord", e.d.EventRecord(ev, 0))
			return e.d.EventQuery(ev)
		}},
		{"context/primary-released-twice", Config{}, driver.ErrInvalidContext, func(e *env) driver.Result {
			e.must("cuDevicePrimaryCtxRelease", e.d.DevicePrimaryCtxRelease(0))
			return e.d.DevicePrimaryCtxRelease(0)
		}},
		{"context/destroyed-with-last-release", Config{}, driver.ErrInvalidContext, func(e *env) driver.Result {
			e.must("cuDevicePrimaryCtxRelease", e.d.DevicePrimaryCtxRelease(0))
			var p driver.DevicePtr
			return e.d.MemAlloc(&p, 4096)
		}},
		{"event/unknown-flag", Config{}, driver.ErrInvalidValue, func(e *env) driver.Result {
			var ev driver.Event
			return e.d.EventCreate(&ev, 0x8) // no CUevent_flags value is 8
		}},
		{"device/bad-ordinal", Config{Devices: 2}, driver.ErrInvalidDevice, func(e *env) driver.Result {
			var d driver.Device
			return e.d.DeviceGet(&d, 2)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, tc.cfg)
			if got := tc.run(e); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestInitRules(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cases := []struct {
		name string
		cfg  Config
		want driver.Result
	}{
		{"stub-library", Config{Stub: true}, driver.ErrStubLibrary},
		{"no-device", Config{NoDevice: true}, driver.ErrNoDevice},
		{"ok", Config{}, driver.Success},
	}
	for _, tc := range cases {
		d := New(tc.cfg).Table()
		if got := d.Init(0); got != tc.want {
			t.Errorf("%s: cuInit = %v, want %v", tc.name, got, tc.want)
		}
	}
	d := New(Config{}).Table()
	var dev driver.Device
	if got := d.DeviceGet(&dev, 0); got != driver.ErrNotInitialized {
		t.Errorf("cuDeviceGet before cuInit = %v, want CUDA_ERROR_NOT_INITIALIZED", got)
	}
	if got := d.Init(1); got != driver.ErrInvalidValue {
		t.Errorf("cuInit(1) = %v, want CUDA_ERROR_INVALID_VALUE", got)
	}
}

// The context is current per OS thread: another thread has none.
func TestContextIsPerThread(t *testing.T) {
	e := setup(t, Config{})
	var p driver.DevicePtr
	e.must("cuMemAlloc", e.d.MemAlloc(&p, 4096))
	got := make(chan driver.Result)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var q driver.DevicePtr
		got <- e.d.MemAlloc(&q, 4096)
	}()
	if r := <-got; r != driver.ErrInvalidContext {
		t.Errorf("cuMemAlloc on a thread with no current context = %v, want CUDA_ERROR_INVALID_CONTEXT", r)
	}
}

// A fault is sticky: every later context call fails with it.
func TestIllegalAddressIsSticky(t *testing.T) {
	e := setup(t, Config{})
	p, _ := e.mapped(g, driver.MemAccessProtRead)
	if r := e.write(p, []byte{1}); r != driver.Success {
		t.Fatalf("write through PROT_READ = %v, want CUDA_SUCCESS (the fault is the device's, reported later)", r)
	}
	if r := e.d.StreamSynchronize(0); r != driver.ErrIllegalAddress {
		t.Fatalf("cuStreamSynchronize after the write = %v, want CUDA_ERROR_ILLEGAL_ADDRESS", r)
	}
	var q driver.DevicePtr
	if r := e.d.MemAlloc(&q, 4096); r != driver.ErrIllegalAddress {
		t.Errorf("cuMemAlloc after the fault = %v, want the sticky CUDA_ERROR_ILLEGAL_ADDRESS", r)
	}
	if st := e.s.Stats(); st.Sticky != driver.ErrIllegalAddress {
		t.Errorf("Stats().Sticky = %v", st.Sticky)
	}
}

// One handle mapped at two addresses shows the same bytes; a PROT_READ
// mapping reads them.
func TestSharedHandle(t *testing.T) {
	e := setup(t, Config{})
	h := e.create(g)
	a, b := e.reserve(g), e.reserve(g)
	e.must("cuMemMap", e.d.MemMap(a, g, 0, h, 0))
	e.must("cuMemMap", e.d.MemMap(b, g, 0, h, 0))
	e.must("cuMemSetAccess", e.access(a, g, driver.MemAccessProtReadWrite))
	e.must("cuMemSetAccess", e.access(b, g, driver.MemAccessProtRead))
	data := []byte("shared physical page")
	e.must("cuMemcpyHtoD", e.write(a+100, data))
	got, r := e.read(b+100, len(data))
	e.must("cuMemcpyDtoH", r)
	if !bytes.Equal(got, data) {
		t.Errorf("second mapping reads %q, want %q", got, data)
	}
}

// Fresh memory is poisoned, never zero; cuMemsetD8 clears it.
func TestFreshMemoryIsPoisoned(t *testing.T) {
	e := setup(t, Config{})
	p, _ := e.mapped(g, driver.MemAccessProtReadWrite)
	got, r := e.read(p, 64)
	e.must("cuMemcpyDtoH", r)
	if !bytes.Equal(got, bytes.Repeat([]byte{poison}, 64)) {
		t.Errorf("fresh memory reads %x, want 0xa5 poison", got[:8])
	}
	e.must("cuMemsetD8", e.d.MemsetD8(p, 0, g))
	got, _ = e.read(p+g-64, 64)
	if !bytes.Equal(got, make([]byte, 64)) {
		t.Errorf("after cuMemsetD8 reads %x", got[:8])
	}
}

// cuMemRelease frees the memory only when the last mapping is gone.
func TestReleaseFreesAtLastUnmap(t *testing.T) {
	e := setup(t, Config{Memory: 64 << 20})
	free := func() uint64 {
		var f, tot uint64
		e.must("cuMemGetInfo", e.d.MemGetInfo(&f, &tot))
		return f
	}
	before := free()
	h := e.create(g)
	a, b := e.reserve(g), e.reserve(g)
	e.must("cuMemMap", e.d.MemMap(a, g, 0, h, 0))
	e.must("cuMemMap", e.d.MemMap(b, g, 0, h, 0))
	e.must("cuMemSetAccess", e.access(b, g, driver.MemAccessProtReadWrite))
	e.must("cuMemRelease", e.d.MemRelease(h))
	if got := before - free(); got != g {
		t.Errorf("after cuMemRelease with 2 mappings, %d bytes in use, want %d", got, g)
	}
	e.must("cuMemcpyHtoD", e.write(b, []byte{7})) // still usable through its mapping
	e.must("cuMemUnmap", e.d.MemUnmap(a, g))
	if got := before - free(); got != g {
		t.Errorf("after the first unmap, %d bytes in use, want %d", got, g)
	}
	e.must("cuMemUnmap", e.d.MemUnmap(b, g))
	if got := before - free(); got != 0 {
		t.Errorf("after the last unmap, %d bytes in use, want 0", got)
	}
	if st := e.s.Stats(); st.Handles != 0 || st.Mappings != 0 {
		t.Errorf("stats after the last unmap: %+v", st)
	}
}

// Manual events complete when the test says, or when their stream is
// synchronized; cuEventSynchronize blocks until then.
func TestManualEvents(t *testing.T) {
	e := setup(t, Config{ManualEvents: true})
	var s driver.Stream
	e.must("cuStreamCreate", e.d.StreamCreate(&s, 0))
	var ev, ev2 driver.Event
	e.must("cuEventCreate", e.d.EventCreate(&ev, driver.EventDisableTiming))
	e.must("cuEventCreate", e.d.EventCreate(&ev2, driver.EventDisableTiming))
	if r := e.d.EventQuery(ev); r != driver.Success {
		t.Errorf("an event never recorded: %v, want CUDA_SUCCESS", r)
	}
	e.must("cuEventRecord", e.d.EventRecord(ev, s))
	if r := e.d.EventQuery(ev); r != driver.ErrNotReady {
		t.Fatalf("recorded event: %v, want CUDA_ERROR_NOT_READY", r)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(time.Millisecond)
		if n := e.s.CompleteEvents(); n != 1 {
			t.Errorf("CompleteEvents completed %d events, want 1", n)
		}
	}()
	e.must("cuEventSynchronize", e.d.EventSynchronize(ev)) // returns once completed
	wg.Wait()
	e.must("cuEventQuery", e.d.EventQuery(ev))
	e.must("cuEventRecord", e.d.EventRecord(ev2, s))
	e.must("cuStreamSynchronize", e.d.StreamSynchronize(s))
	e.must("cuEventQuery", e.d.EventQuery(ev2))
	e.must("cuEventDestroy", e.d.EventDestroy(ev))
	e.must("cuEventDestroy", e.d.EventDestroy(ev2))
	e.must("cuStreamDestroy", e.d.StreamDestroy(s))
}

func TestFailCall(t *testing.T) {
	e := setup(t, Config{})
	e.s.FailCall("cuMemCreate", 2, driver.ErrOutOfMemory)
	e.create(g)
	var h driver.MemHandle
	prop := driver.DeviceProp(0)
	if r := e.d.MemCreate(&h, g, &prop, 0); r != driver.ErrOutOfMemory {
		t.Errorf("second cuMemCreate = %v, want the injected CUDA_ERROR_OUT_OF_MEMORY", r)
	}
	e.create(g)
	if n := e.s.Calls("cuMemCreate"); n != 3 {
		t.Errorf("Calls(cuMemCreate) = %d, want 3", n)
	}
}

// Config.Faults is asked before every entry point with the call's name and
// number; an injected error becomes the CUresult it carries or the nearest
// one to its kind, and the refused call changes nothing.
func TestInjector(t *testing.T) {
	var trace memapi.Trace
	oom := memapi.Fail(memapi.ErrOutOfMemory).On(Layer, "cuMemCreate").When(func(op memapi.Op) bool { return op.Call == 2 })
	e := setup(t, Config{Faults: memapi.Any(&trace, oom)})
	e.create(g)
	before := e.s.Stats()
	var h driver.MemHandle
	prop := driver.DeviceProp(0)
	if r := e.d.MemCreate(&h, g, &prop, 0); r != driver.ErrOutOfMemory {
		t.Fatalf("second cuMemCreate = %v, want CUDA_ERROR_OUT_OF_MEMORY", r)
	}
	if after := e.s.Stats(); after != before {
		t.Fatalf("an injected fault changed the simulator: %+v -> %+v", before, after)
	}
	want := []memapi.Op{
		{Layer: Layer, Name: "cuInit", Call: 1},
		{Layer: Layer, Name: "cuDevicePrimaryCtxRetain", Call: 1},
		{Layer: Layer, Name: "cuCtxSetCurrent", Call: 1},
		{Layer: Layer, Name: "cuMemCreate", Call: 1},
		{Layer: Layer, Name: "cuMemCreate", Call: 2},
	}
	if got := trace.Ops(); !slices.Equal(got, want) {
		t.Fatalf("the injector saw %v, want %v", got, want)
	}
	for _, c := range []struct {
		err  error
		want driver.Result
	}{
		{driver.ErrInvalidHandle, driver.ErrInvalidHandle},
		{fmt.Errorf("wrapped: %w", driver.ErrNotReady), driver.ErrNotReady},
		{memapi.ErrUnsupported, driver.ErrNotSupported},
		{&memapi.Error{Kind: memapi.ErrInvalidRange}, driver.ErrInvalidValue},
		{errors.New("anything"), driver.ErrUnknown},
	} {
		e.s.Inject(memapi.Fail(c.err).On(Layer, "cuMemGetInfo").Nth(1))
		var free, total uint64
		if r := e.d.MemGetInfo(&free, &total); r != c.want {
			t.Errorf("injected %v: cuMemGetInfo = %v, want %v", c.err, r, c.want)
		}
	}
	e.s.ClearFaults()
	h = e.create(g)
	e.must("cuMemRelease", e.d.MemRelease(h))
}

func TestErrorNames(t *testing.T) {
	d := New(Config{}).Table()
	for _, c := range []driver.Result{driver.ErrOutOfMemory, driver.ErrNotReady, driver.ErrStubLibrary} {
		want, _ := c.Name()
		if got := d.ErrorName(c); got != want {
			t.Errorf("ErrorName(%d) = %q, want %q", c, got, want)
		}
	}
	var p *byte
	if r := d.GetErrorName(4242, &p); r != driver.ErrInvalidValue || p != nil {
		t.Errorf("cuGetErrorName(4242) = %v, %v", r, p)
	}
	if got := d.ErrorName(4242); got != "CUresult(4242)" {
		t.Errorf("ErrorName(4242) = %q", got)
	}
}

// The simulator fills every entry of the table.
func TestTableComplete(t *testing.T) {
	d := New(Config{}).Table()
	for _, e := range d.Entries() {
		if isNilFunc(e.Field) {
			t.Errorf("%s is not set", e.Symbols[0])
		}
	}
}
