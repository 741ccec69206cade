package plugin

import (
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// TestConformance runs the generated conformance suite on the reference C
// plugin through the loader, bare and through the checked wrapper in verify
// mode (which also checks that every figure moved by exactly what the spec
// declares).
func TestConformance(t *testing.T) {
	path := refhost(t)
	for _, wrapped := range []bool{false, true} {
		name := "bare"
		if wrapped {
			name = "checked"
		}
		t.Run(name, func(t *testing.T) {
			conformance.Run(t, func(t *testing.T) conformance.Subject {
				m, c := newSubject(t, path)
				var mech memapi.Mechanism = m
				if wrapped {
					mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
				}
				d := m.Declaration()
				return conformance.Subject{Mechanism: mech, Context: c, Declared: &d}
			})
		})
	}
}
