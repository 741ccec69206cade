package example

import (
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// TestConformance runs the generated conformance suite on the example
// mechanism, bare and through the checked wrapper in verify mode: the
// factory makes a fresh mechanism and its device context for every subtest.
func TestConformance(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		name := "bare"
		if wrapped {
			name = "checked"
		}
		t.Run(name, func(t *testing.T) {
			conformance.Run(t, func(t *testing.T) conformance.Subject {
				m := New(Options{})
				c := NewContext(m)
				t.Cleanup(func() {
					if err := c.Close(); err != nil {
						t.Errorf("context close: %v", err)
					}
				})
				var mech memapi.Mechanism = m
				if wrapped {
					mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
				}
				return conformance.Subject{Mechanism: mech, Context: c}
			})
		})
	}
}
