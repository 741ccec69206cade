// Package fakestest tests the generated fakes of package fakes: their state
// model (host memory, accounting, typed errors), recording, stubs, canned
// results, fault injection, lying-eager mode, device contexts with automatic
// and manual fences, the fake ledger, and their conformance to the generated
// suite, bare and through the checked wrapper. It holds tests only.
package fakestest
