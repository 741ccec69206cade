package cudasim

import (
	"bytes"
	"runtime"
	"testing"
	"unsafe"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Where the documentation is silent about something code could come to rely
// on, the simulator takes the strict side, so the reliance fails here and
// not first on a GPU: the VMM calls and the granularity query need a current
// context, the default reservation alignment is the host page only, and a
// non-blocking stream does not wait for the legacy stream's work.
func TestDocumentedSilence(t *testing.T) {
	t.Run("vmm-needs-context", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		s := New(Config{})
		d := s.Table()
		if r := d.Init(0); r != driver.Success {
			t.Fatal(r)
		}
		_ = d.CtxSetCurrent(0)
		prop := driver.DeviceProp(0)
		desc := driver.MemAccessDesc{Location: driver.MemLocation{Type: driver.MemLocationTypeDevice, ID: 0}, Flags: driver.MemAccessProtReadWrite}
		var gran uint64
		var p driver.DevicePtr
		var h driver.MemHandle
		for _, step := range []struct {
			call string
			r    func() driver.Result
		}{
			{"cuMemGetAllocationGranularity", func() driver.Result {
				return d.MemGetAllocationGranularity(&gran, &prop, driver.MemAllocGranularityMinimum)
			}},
			{"cuMemAddressReserve", func() driver.Result { return d.MemAddressReserve(&p, g, g, 0, 0) }},
			{"cuMemCreate", func() driver.Result { return d.MemCreate(&h, g, &prop, 0) }},
			{"cuMemMap", func() driver.Result { return d.MemMap(p, g, 0, h, 0) }},
			{"cuMemSetAccess", func() driver.Result { return d.MemSetAccess(p, g, &desc, 1) }},
			{"cuMemUnmap", func() driver.Result { return d.MemUnmap(p, g) }},
			{"cuMemRelease", func() driver.Result { return d.MemRelease(h) }},
			{"cuMemAddressFree", func() driver.Result { return d.MemAddressFree(p, g) }},
		} {
			if r := step.r(); r != driver.ErrInvalidContext {
				t.Errorf("%s with no current context = %v, want CUDA_ERROR_INVALID_CONTEXT", step.call, r)
			}
		}
	})
	t.Run("default-reservation-alignment", func(t *testing.T) {
		e := setup(t, Config{})
		for _, size := range []uint64{g, 3 * g, 1 << 40} {
			var p driver.DevicePtr
			e.must("cuMemAddressReserve", e.d.MemAddressReserve(&p, size, 0, 0, 0))
			if uint64(p)%hostPage != 0 || uint64(p)%g == 0 {
				t.Errorf("reservation of %d bytes at alignment 0: %#x, want a host page multiple that is not a granularity multiple", size, p)
			}
			if r := e.d.MemMap(p, g, 0, e.create(g), 0); r != driver.ErrInvalidValue {
				t.Errorf("cuMemMap at a reservation of alignment 0: %v, want CUDA_ERROR_INVALID_VALUE", r)
			}
			var q driver.DevicePtr
			e.must("cuMemAddressReserve", e.d.MemAddressReserve(&q, size, g, 0, 0))
			if uint64(q)%g != 0 {
				t.Errorf("reservation of %d bytes at alignment %d: %#x", size, g, q)
			}
		}
	})
	t.Run("non-blocking-stream", func(t *testing.T) {
		e := setup(t, Config{})
		p, _ := e.mapped(g, driver.MemAccessProtReadWrite)
		e.must("cuMemsetD8", e.d.MemsetD8(p, 0, g)) // queued on the legacy stream
		var nb, blocking driver.Stream
		e.must("cuStreamCreate", e.d.StreamCreate(&nb, driver.StreamNonBlocking))
		e.must("cuStreamCreate", e.d.StreamCreate(&blocking, driver.StreamDefault))
		buf := make([]byte, 16)
		e.must("cuMemcpyDtoHAsync", e.d.MemcpyDtoHAsync(unsafe.Pointer(&buf[0]), p, 16, nb))
		if !bytes.Equal(buf, bytes.Repeat([]byte{poison}, 16)) {
			t.Errorf("non-blocking stream read %x, want the bytes before the queued memset", buf)
		}
		e.must("cuMemcpyDtoHAsync", e.d.MemcpyDtoHAsync(unsafe.Pointer(&buf[0]), p, 16, blocking))
		if !bytes.Equal(buf, make([]byte, 16)) {
			t.Errorf("blocking stream read %x, want the memset's zeros", buf)
		}
		if r := e.d.MemcpyDtoHAsync(unsafe.Pointer(&buf[0]), p, 16, 0xdead); r != driver.ErrInvalidHandle {
			t.Errorf("cuMemcpyDtoHAsync on an unknown stream: %v", r)
		}
		e.must("cuStreamDestroy", e.d.StreamDestroy(nb))
		e.must("cuStreamDestroy", e.d.StreamDestroy(blocking))
	})
}
