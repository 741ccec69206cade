// Package metamorphic runs one random sequence of memory operations on the
// three implementations of the contract a test can run in-process — the
// generated fakes (package fakes), the CPU mechanism (mechanisms/cpu) and the
// CUDA mechanism over the simulated driver (mechanisms/cuda with
// mechanisms/cuda/cudasim) — each behind the checked wrapper with the fakes'
// trusted ledger, all with the same granularities and the same capacity (the
// CPU mechanism has none), and checks after every step that the three agree:
// the same error kind, the same figures (UsedBytes, CommittedBytes,
// ViewCount, the grant's drawn bytes, the account's refunded bytes), that
// what each really holds (the fakes' live handles, the kernel's pages, the
// simulated device's memory) is what its books say, and at the end nothing
// held once everything is released.
//
// The sequences come from pgregory.net/rapid, which shrinks a failing one to
// its shortest form and prints it with its seed. docs/conformance.md (section
// "Metamorphic test") says what runs, the figures, and the differences the
// test allows on purpose. The package holds tests only.
package metamorphic
