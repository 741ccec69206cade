package cudasim

import (
	"bytes"
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// The simulator is no stricter than the driver's documentation where a GPU
// is not either: a mapping may start at a granularity offset into its
// handle. (A reservation's size used to be allowed any host page multiple,
// as the documentation says; a GPU refuses that, and so does the simulator
// now: see memAddressReserve.)
func TestDocumentedLatitude(t *testing.T) {
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
