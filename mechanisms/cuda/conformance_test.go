package cuda

import (
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// factory makes a fresh mechanism and device context per subtest, bare or
// through the checked wrapper in verify mode. The simulator's granularity is
// gran (the suite's sizes are multiples of it); the real driver reports its own.
func factory(gran uint64, wrap bool) conformance.Factory {
	return func(t *testing.T) conformance.Subject {
		tbl, _ := testDriver(t, cudasim.Config{Granularity: gran})
		m, err := New(Config{Driver: tbl})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c, err := m.NewContext()
		if err != nil {
			t.Fatalf("NewContext: %v", err)
		}
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Context.Close: %v", err)
			}
			if err := m.Close(); err != nil {
				t.Errorf("Mechanism.Close: %v", err)
			}
		})
		var mech memapi.Mechanism = m
		if wrap {
			mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
		}
		return conformance.Subject{Mechanism: mech, Context: c}
	}
}

// simGranularity is the simulator's granularity in the conformance runs: the
// rules do not depend on it, and 64 KiB keeps the suite quick under -race.
// The 2 MiB variant (what GPUs report) runs too when -race is off.
const simGranularity = 64 << 10

func TestConformance(t *testing.T) {
	t.Run("bare", func(t *testing.T) { conformance.Run(t, factory(simGranularity, false)) })
	t.Run("checked", func(t *testing.T) { conformance.Run(t, factory(simGranularity, true)) })
	if realDriver() {
		return // the device's granularity is the only one
	}
	if raceEnabled || testing.Short() {
		t.Log("2 MiB granularity variant skipped under -race or -short")
		return
	}
	t.Run("2MiB/checked", func(t *testing.T) { conformance.Run(t, factory(2<<20, true)) })
}

// A device without VMM offers DeviceAllocator only; the suite checks that the
// absent capabilities are absent, not no-ops.
func TestConformanceWithoutVMM(t *testing.T) {
	simOnly(t)
	conformance.Run(t, func(t *testing.T) conformance.Subject {
		sim := cudasim.New(cudasim.Config{NoVMM: true, Granularity: simGranularity})
		m, err := New(Config{Driver: sim.Table()})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c, err := m.NewContext()
		if err != nil {
			t.Fatalf("NewContext: %v", err)
		}
		t.Cleanup(func() { _ = c.Close(); _ = m.Close() })
		return conformance.Subject{
			Mechanism: checked.Wrap(m, conformance.Ledger, checked.WithVerify()),
			Context:   c,
			Lacks:     memapi.Of(memapi.CapVirtualBacking, memapi.CapSharedMapping),
		}
	})
}
