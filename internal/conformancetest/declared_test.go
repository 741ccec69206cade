package conformancetest

import (
	"strings"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// hidden is a fake behind a type of its own that hides the fake's
// Declaration; unwrap, when set, is what its Unwrap returns.
type hidden struct {
	memapi.Mechanism
	self bool // Unwrap returns the wrapper itself
}

func (h hidden) Unwrap() memapi.Mechanism {
	if h.self {
		return h
	}
	return h.Mechanism
}

// TestDeclarationFound: the suite finds a subject's declaration through any
// chain of wrappers that say what they wrap (the checked wrapper, a wrapper
// of the caller's), and a mechanism without one fails spec/name naming the
// spec's mechanisms, even when its Unwrap loops.
func TestDeclarationFound(t *testing.T) {
	subject := func(wrap func(memapi.Mechanism) memapi.Mechanism) *Results {
		return Record(func(t conformance.T) conformance.Subject {
			m := fakes.NewMechanism(fakes.Config{Name: "arena"})
			c := fakes.NewContext(m)
			t.Cleanup(func() { c.CompleteAll(); _ = c.Close() })
			return conformance.Subject{Mechanism: wrap(m), Context: c}
		})
	}
	spec := []string{"spec/name", "spec/offers", "spec/device", "spec/granularity"}
	for _, c := range []struct {
		name string
		wrap func(memapi.Mechanism) memapi.Mechanism
	}{
		{"fake", func(m memapi.Mechanism) memapi.Mechanism { return m }},
		{"checked", func(m memapi.Mechanism) memapi.Mechanism {
			return checked.Wrap(m, conformance.Ledger, checked.WithVerify())
		}},
		{"unwrapping/checked", func(m memapi.Mechanism) memapi.Mechanism {
			return hidden{Mechanism: checked.Wrap(m, conformance.Ledger)}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := subject(c.wrap)
			for _, n := range spec {
				if o, ok := res.Outcome(n); !ok || o.Failed || o.Skipped {
					t.Errorf("%s: %+v, want passed against the fake's own declaration", n, o)
				}
			}
		})
	}
	for _, c := range []struct {
		name string
		wrap func(memapi.Mechanism) memapi.Mechanism
	}{
		{"undeclared", func(m memapi.Mechanism) memapi.Mechanism { return Undeclared(m) }},
		{"unwrap-loop", func(m memapi.Mechanism) memapi.Mechanism { return hidden{Mechanism: Undeclared(m), self: true} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := subject(c.wrap)
			o, ok := res.Outcome("spec/name")
			if !ok || !o.Failed || !strings.Contains(strings.Join(o.Log, "\n"), `mechanism "arena"`) ||
				!strings.Contains(strings.Join(o.Log, "\n"), "matches no mechanism the spec declares (cpu, cuda, example)") {
				t.Fatalf("spec/name = %+v, want a failure naming the mechanism and the spec's mechanisms", o)
			}
			for _, n := range spec[1:] {
				if o, _ := res.Outcome(n); !o.Skipped {
					t.Errorf("%s: %+v, want skipped after spec/name's failure", n, o)
				}
			}
		})
	}
}
