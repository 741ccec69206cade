// Package checkedtest tests the generated checked wrapper (package
// generated/checked) from the outside: every typed error it returns, the
// ledger movements it makes, verify mode against deliberately broken
// mechanisms, negotiation through the wrapper, and its cost against the bare
// mechanism (bench_test.go).
//
// The tests use their own small in-memory mechanism (mech_test.go), honest by
// default and broken on request, and ledger doubles that count every call, so
// that a test can show not only the error but that nothing underneath moved.
// They run again over the generated fakes (fakes_test.go).
package checkedtest
