package fakestest

import (
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// factory makes a fresh fake and context per subtest; wrap, when set, puts
// the checked wrapper in front of the fake.
func factory(cfg fakes.Config, wrap func(memapi.Mechanism) memapi.Mechanism) conformance.Factory {
	return func(t *testing.T) conformance.Subject {
		m := fakes.NewMechanism(cfg)
		c := fakes.NewContext(m)
		t.Cleanup(func() {
			c.CompleteAll()
			if err := c.Close(); err != nil {
				t.Errorf("fake context close: %v", err)
			}
		})
		var mech memapi.Mechanism = m
		if wrap != nil {
			mech = wrap(m)
		}
		return conformance.Subject{Mechanism: mech, Context: c}
	}
}

func TestConformanceBare(t *testing.T) {
	conformance.Run(t, factory(fakes.Config{}, nil))
}

func TestConformanceChecked(t *testing.T) {
	conformance.Run(t, factory(fakes.Config{}, func(m memapi.Mechanism) memapi.Mechanism {
		return checked.Wrap(m, conformance.Ledger, checked.WithVerify())
	}))
}

// The suite must hold for every shape the fakes take: subsets of the optional
// capabilities (absent ones reported as unsupported), other granularities.
func TestConformanceShapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  fakes.Config
	}{
		{"allocator-only", fakes.Config{Offers: memapi.Of(memapi.CapDeviceAllocator)}},
		{"virtual-only", fakes.Config{Offers: memapi.Of(memapi.CapVirtualBacking)}},
		{"2MiB-granularity", fakes.Config{AllocGranularity: 512, Granularity: 2 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conformance.Run(t, factory(tc.cfg, func(m memapi.Mechanism) memapi.Mechanism {
				return checked.Wrap(m, conformance.Ledger, checked.WithVerify())
			}))
		})
	}
}

// The lying-eager fake reproduces the accounting bug the checked wrapper's
// verify mode exists to catch; without verify the lie goes through.
func TestLyingEagerCaughtByVerify(t *testing.T) {
	for _, verify := range []bool{false, true} {
		m := fakes.NewMechanism(fakes.Config{LyingEager: true})
		var opts []checked.Option
		if verify {
			opts = append(opts, checked.WithVerify())
		}
		vb, err := memapi.RequireVirtualBacking(checked.Wrap(m, fakes.Ledger, opts...))
		ok(t, err)
		g := fakes.NewGrant("fake", 1<<30)
		res, err := vb.Reserve(bg, memapi.ReserveRequest{Size: 4 * g64})
		if err == nil {
			err = vb.Commit(bg, res, memapi.Range{Len: g64}, g)
		}
		// Verify catches the lie at the first call whose accounting it
		// breaks: Reserve (physical bytes taken by an address-only call) or
		// Commit (committed bytes that do not move).
		if verify {
			is(t, err, memapi.ErrUntruthful)
		} else {
			ok(t, err)
		}
	}
}
