// Package conformancetest runs the generated conformance suite where a test
// needs its outcome rather than its report, and runs it on the generated
// fakes.
//
// It holds a recording conformance.T (Record) that runs the suite without
// reporting to the testing package and keeps the outcome of every subtest,
// and Undeclared, which presents a mechanism of a package the spec declares
// as a test mechanism. The meta-tests that break a mechanism on purpose and
// check that the suite fails the subtest meant to catch each break live with
// the mechanism they break, in mechanisms/example. The generated fakes run
// the suite here, bare and through the checked wrapper.
package conformancetest
