package cpu

import (
	"fmt"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// TestConformance runs the generated conformance suite on the CPU
// mechanism at both granularities, bare and through the checked wrapper in
// verify mode (which also checks that every figure moved by exactly what the
// spec declares).
func TestConformance(t *testing.T) {
	for _, gran := range []memapi.Bytes{Granularity4KiB, Granularity2MiB} {
		for _, wrapped := range []bool{false, true} {
			name := fmt.Sprintf("gran=%dKiB/bare", gran/kib)
			if wrapped {
				name = fmt.Sprintf("gran=%dKiB/checked", gran/kib)
			}
			t.Run(name, func(t *testing.T) {
				conformance.Run(t, func(t *testing.T) conformance.Subject {
					m, err := New(Options{Granularity: gran})
					if err != nil {
						t.Fatal(err)
					}
					c := NewContext(m)
					t.Cleanup(func() {
						if err := c.Close(); err != nil {
							t.Errorf("context close: %v", err)
						}
						checkKernel(t, m)
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
}
