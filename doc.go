// Package memgen is a framework for device memory in inference runtimes.
//
// The spec (spec/capabilities.yaml) declares the memory mechanisms, the
// capabilities each offers and the accounting invariants; the memgen tool
// (cmd/memgen) generates from it the typed contract (generated/memapi),
// invariant-checking wrappers (generated/checked), stateful fakes (fakes) and a
// conformance suite (generated/conformance). See README.md for a tour.
package memgen

//go:generate go run ./cmd/memgen generate
