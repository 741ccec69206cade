package cudasim

import (
	"bytes"
	"runtime"
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// The simulator is no stricter than the driver's documentation: the VMM
// calls need no current context, a reservation's size is a multiple of the
// host page, and a mapping may start at a granularity offset into its handle.
func TestDocumentedLatitude(t *testing.T) {
	t.Run("vmm-without-context", func(t *testing.T) {
		s := New(Config{})
		d := s.Table()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if r := d.Init(0); r != driver.Success {
			t.Fatal(r)
		}
		prop := driver.DeviceProp(0)
		desc := driver.MemAccessDesc{Location: driver.MemLocation{Type: driver.MemLocationTypeDevice, ID: 0}, Flags: driver.MemAccessProtReadWrite}
		var p driver.DevicePtr
		var h driver.MemHandle
		for _, step := range []struct {
			call string
			r    func() driver.Result
		}{
			{"cuMemAddressReserve", func() driver.Result { return d.MemAddressReserve(&p, g, 0, 0, 0) }},
			{"cuMemCreate", func() driver.Result { return d.MemCreate(&h, g, &prop, 0) }},
			{"cuMemMap", func() driver.Result { return d.MemMap(p, g, 0, h, 0) }},
			{"cuMemSetAccess", func() driver.Result { return d.MemSetAccess(p, g, &desc, 1) }},
			{"cuMemUnmap", func() driver.Result { return d.MemUnmap(p, g) }},
			{"cuMemRelease", func() driver.Result { return d.MemRelease(h) }},
			{"cuMemAddressFree", func() driver.Result { return d.MemAddressFree(p, g) }},
		} {
			if r := step.r(); r != driver.Success {
				t.Errorf("%s with no current context = %v, want CUDA_SUCCESS", step.call, r)
			}
		}
	})
	t.Run("reserve-host-page-multiple", func(t *testing.T) {
		e := setup(t, Config{})
		var p driver.DevicePtr
		e.must("cuMemAddressReserve", e.d.MemAddressReserve(&p, g+4096, 0, 0, 0))
		e.must("cuMemAddressFree", e.d.MemAddressFree(p, g+4096))
	})
	t.Run("map-at-offset", func(t *testing.T) {
		e := setup(t, Config{})
		whole, h := e.mapped(2*g, driver.MemAccessProtReadWrite)
		e.must("cuMemcpyHtoD", e.write(whole+g, []byte("second half")))
		p := e.reserve(g)
		e.must("cuMemMap", e.d.MemMap(p, g, g, h, 0))
		e.must("cuMemSetAccess", e.access(p, g, driver.MemAccessProtRead))
		got, r := e.read(p, len("second half"))
		e.must("cuMemcpyDtoH", r)
		if !bytes.Equal(got, []byte("second half")) {
			t.Errorf("mapping at offset g reads %q", got)
		}
	})
}
