// Package conformancetest proves that the generated conformance suite can
// fail, and runs it on the implementations that must pass it.
//
// It holds a small honest in-memory mechanism (Mechanism, Context), a
// recording conformance.T (Record) that runs the suite without reporting to
// the testing package and keeps the outcome of every subtest, and the
// meta-tests: deliberately broken mechanisms built by embedding the honest
// one, each of which must fail the specific subtest that catches its bug,
// while the honest mechanism fails none. The generated fakes run the suite
// here too, bare and through the checked wrapper.
package conformancetest
