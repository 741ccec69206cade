package gen

import "sort"

// enforcers is the closed vocabulary of an invariant's enforced_by: each name
// says which part of memgen answers for the invariant, and the sentence is
// what the capability reference prints for it. A name outside this list is a
// spec error, so a typo cannot silently drop an invariant from the checked
// wrapper or the docs. The generator gives checked-wrapper and
// checked-wrapper-verify their meaning; the others name hand-written parts.
var enforcers = map[string]string{
	"signature":              "The generated signatures: a consuming method cannot be called without a grant.",
	"checked-wrapper":        "The generated checked wrapper (package checked) draws, undraws and refunds around every call.",
	"checked-wrapper-verify": "The checked wrapper's verify mode (WithVerify) compares the mechanism's counters with the declared effect.",
	"handle-creator":         "Handles record the instance that created them; its Issuer is the only way to release them.",
	"negotiation":            "Capability negotiation (memapi.Negotiate and the Mechanism accessors) reports what an instance offers now.",
	"require-helpers":        "The generated Require helpers return ErrUnsupported for an absent capability.",
	"pmm-binding":            "The ProcessMemoryManager's bindings (package pmm) ask the installed mechanism at every call.",
	"pmm-transactions":       "The ProcessMemoryManager's transactions (package pmm) undo every step of a failed operation.",
	"ep-deferred-free":       "The execution provider's deferred-free queue (package ep) frees behind device fences.",
	"ep-context-refcount":    "The execution provider's device contexts (package ep) count the allocations made in them.",
	"governor-api":           "The governor's API (package governor) asks holders to free memory and never frees it itself.",
	"package-boundaries":     "The import structure: the manager does not import the execution side.",
}

// enforcerNames returns the vocabulary sorted, for error messages.
func enforcerNames() []string {
	ns := make([]string, 0, len(enforcers))
	for n := range enforcers {
		ns = append(ns, n)
	}
	sort.Strings(ns)
	return ns
}
