package cudasim

import (
	"bytes"
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// The simulator is no stricter than the driver's documentation: a
// reservation's size is a multiple of the host page, and a mapping may start
// at a granularity offset into its handle.
func TestDocumentedLatitude(t *testing.T) {
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
