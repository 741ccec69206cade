package example

import (
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
)

// misnamed is the example mechanism reporting "Example", while the spec's
// key for its package is "example": the mistake of a mechanism whose name
// differs from its spec key only in case.
type misnamed struct{ *Mechanism }

func (m misnamed) Info() memapi.MechanismInfo {
	i := m.Mechanism.Info()
	i.Mechanism = "Example"
	return i
}

// TestMisnamedFails: in a package the spec declares, a mechanism reporting
// another name than its spec key (SpecName) fails spec/name, and the other
// spec subtests run against the package's entry instead of being skipped,
// bare and through the checked wrapper (which the suite looks through to
// the package of the mechanism beneath: before, the wrapper's package
// matched nothing and every spec subtest was skipped).
func TestMisnamedFails(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		name := "bare"
		if wrapped {
			name = "checked"
		}
		t.Run(name, func(t *testing.T) { testMisnamed(t, wrapped) })
	}
}

func testMisnamed(t *testing.T, wrapped bool) {
	res := conformancetest.Record(func(t conformance.T) conformance.Subject {
		m := New(Options{})
		c := NewContext(m)
		t.Cleanup(func() { _ = c.Close() })
		var mech memapi.Mechanism = misnamed{m}
		if wrapped {
			mech = checked.Wrap(mech, conformance.Ledger, checked.WithVerify())
		}
		return conformance.Subject{Mechanism: mech, Context: c}
	})
	o, ok := res.Outcome("spec/name")
	if !ok || !o.Failed || !strings.Contains(strings.Join(o.Log, "\n"), `declares the mechanism as "example"`) {
		t.Fatalf("spec/name = %+v, want a failure naming the spec key", o)
	}
	for _, n := range []string{"spec/offers", "spec/device", "spec/granularity"} {
		if o, _ := res.Outcome(n); o.Skipped || o.Failed {
			t.Errorf("%s: skipped %v, failed %v, want it run against the package's entry and passed:\n%s", n, o.Skipped, o.Failed, strings.Join(o.Log, "\n"))
		}
	}
	if SpecName != "example" {
		t.Errorf("SpecName = %q, want the spec key example", SpecName)
	}
}
