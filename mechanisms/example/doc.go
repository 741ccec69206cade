// Package example is the worked example of README's "Adding a mechanism": a
// small mechanism over host memory from the Go heap that offers every
// capability (DeviceAllocator, VirtualBacking, SharedMapping), with the
// device context the conformance suite needs. It is declared in
// spec/capabilities.yaml as mechanism "example"; memgen writes
// zz_generated.memgen.go beside it; conformance_test.go runs the generated
// suite against it, bare and through the checked wrapper.
//
// Read it in this order: mechanism.go (Options, New, DeviceAllocator: the
// part every mechanism writes), virtualbacking.go and sharedmapping.go (the
// optional capabilities, offered through the offers hook the generated
// accessors ask), context.go (streams, copies and fences over the
// mechanism's addresses). It is not meant for production; mechanisms/cpu is
// the host mechanism for that.
//
// It is also the one in-memory mechanism of the project's own tests: the
// meta-tests of this package (meta_test.go, broken_test.go) break it on
// purpose, one rule of the spec at a time, and check that the suite fails
// the subtest meant to catch each break, while the honest mechanism fails
// none.
package example
