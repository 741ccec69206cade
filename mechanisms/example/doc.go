// Package example is the worked example of README's "Adding a mechanism": a
// small mechanism that offers DeviceAllocator only, over host memory from
// the Go heap, with the device context the conformance suite needs. It is
// declared in spec/capabilities.yaml as mechanism "example"; memgen writes
// zz_generated.memgen.go beside it; conformance_test.go runs the generated
// suite against it, bare and through the checked wrapper.
//
// Addresses are its own: each allocation gets a range of a private address
// space (with an unmapped page after it, so that a copy that overruns an
// allocation fails instead of reaching its neighbour), and the device
// context resolves an address to the allocation's bytes. It is not meant
// for production; mechanisms/cpu is the host mechanism for that.
package example
