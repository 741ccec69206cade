package conformancetest

import (
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// fakeFactory makes a fresh fake mechanism with its context per subtest,
// optionally through the checked wrapper in verify mode.
func fakeFactory(cfg fakes.Config, wrap bool) conformance.Factory {
	return func(t *testing.T) conformance.Subject {
		m := fakes.NewMechanism(cfg)
		ctx := fakes.NewContext(m)
		t.Cleanup(func() {
			if err := ctx.Close(); err != nil {
				t.Errorf("closing the fake context: %v", err)
			}
		})
		var mech memapi.Mechanism = m
		if wrap {
			mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
		}
		return conformance.Subject{Mechanism: mech, Context: ctx}
	}
}

// TestFakes runs the suite on the generated fakes, bare and through the
// checked wrapper, with every capability and with DeviceAllocator only.
func TestFakes(t *testing.T) {
	configs := map[string]fakes.Config{
		"all":       {},
		"allocator": {Offers: memapi.Of(memapi.CapDeviceAllocator)},
	}
	for name, cfg := range configs {
		t.Run(name+"/bare", func(t *testing.T) { conformance.Run(t, fakeFactory(cfg, false)) })
		t.Run(name+"/checked", func(t *testing.T) { conformance.Run(t, fakeFactory(cfg, true)) })
	}
}
