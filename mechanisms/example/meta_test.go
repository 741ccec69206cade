package example

import (
	"slices"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
)

// Config is the shape the meta-tests give the mechanism. Unlike the
// example's own Options, its zero value is a test mechanism the spec does not
// declare: named "mem", of authority "mem", with 4 KiB allocation and 64 KiB
// mapping granules and no capacity below the 4 GiB a single request may take.
type Config struct {
	Name             memapi.MechanismID // Info().Mechanism; default "mem", which the spec does not declare
	Offers           memapi.CapSet      // 0: every capability
	AllocGranularity memapi.Bytes       // default 4096
	Granularity      memapi.Bytes       // default 65536
}

// options turns a Config into the mechanism's Options.
func (cfg Config) options() Options {
	o := Options{Authority: "mem", Capacity: 1 << 32, name: cfg.Name, offers: cfg.Offers,
		allocGranularity: cfg.AllocGranularity, granularity: cfg.Granularity}
	if o.name == "" {
		o.name = "mem"
	}
	if o.allocGranularity == 0 {
		o.allocGranularity = 4096
	}
	if o.granularity == 0 {
		o.granularity = 65536
	}
	return o
}

// factory makes a fresh in-memory mechanism per subtest, changed by wrap,
// and presents it as a mechanism of no declared package
// (conformancetest.Undeclared): the spec/... subtests look it up by the name
// it reports. Under a name the spec declares ("cpu", "cuda") that is the
// spec's entry; under any other the subject declares what the mechanism
// really is (Subject.Declared: its name, host, its configured capabilities,
// granularity kind "device"), as a test mechanism must: the suite fails a
// mechanism with no declaration.
func factory(cfg Config, wrap func(*Mechanism) memapi.Mechanism) conformance.FactoryT {
	return func(t conformance.T) conformance.Subject {
		m := New(cfg.options())
		ctx := NewContext(m)
		t.Cleanup(func() {
			if err := ctx.Close(); err != nil {
				t.Errorf("closing the context: %v", err)
			}
		})
		var mech memapi.Mechanism = m
		if wrap != nil {
			mech = wrap(m)
		}
		s := conformance.Subject{Mechanism: conformancetest.Undeclared(mech), Context: ctx}
		if _, inSpec := memapi.MechanismSpec(m.Info().Mechanism); !inSpec {
			s.Declared = &memapi.MechanismMeta{Name: m.Info().Mechanism, Device: "Host", Offers: memapi.Negotiate(m), Granularity: "device"}
		}
		return s
	}
}

func verified(inner func(*Mechanism) memapi.Mechanism) func(*Mechanism) memapi.Mechanism {
	return func(m *Mechanism) memapi.Mechanism {
		var mech memapi.Mechanism = m
		if inner != nil {
			mech = inner(m)
		}
		return checked.Wrap(mech, conformance.Ledger, checked.WithVerify())
	}
}

// TestNames keeps the suite's names usable: unique, and never both a subtest
// and a group of subtests.
func TestNames(t *testing.T) {
	names := conformance.Names()
	if len(names) < 100 {
		t.Errorf("the suite has %d subtests, expected well over 100", len(names))
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("duplicate subtest %q", n)
		}
		seen[n] = true
	}
	for _, n := range names {
		if strings.Contains(n, " ") {
			t.Errorf("subtest %q has a space (testing rewrites it, -run cannot match it)", n)
		}
		for _, m := range names {
			if strings.HasPrefix(m, n+"/") {
				t.Errorf("%q is both a subtest and the group of %q", n, m)
			}
		}
	}
}

// TestHonestPasses: the honest mechanism, in every shape, fails nothing;
// what it does not offer is skipped, never silently passed.
func TestHonestPasses(t *testing.T) {
	cases := []struct {
		name    string
		cfg     Config
		skipped []string // must be skipped
		ran     []string // must have run (not skipped)
	}{
		{name: "all", cfg: Config{}, ran: []string{"SharedMapping/CopyOnWrite/private-copy", "VirtualBacking/Commit/unaligned", "invariant/no-silent-noop/SharedMapping"}},
		{name: "small-granules", cfg: Config{AllocGranularity: 256, Granularity: 4096}},
		{name: "byte-allocations", cfg: Config{AllocGranularity: 1, Granularity: 1 << 16}},
		{
			name:    "allocator-only",
			cfg:     Config{Offers: memapi.Of(memapi.CapDeviceAllocator)},
			skipped: []string{"VirtualBacking/Commit/unaligned", "SharedMapping/CopyOnWrite/private-copy", "invariant/no-silent-noop/VirtualBacking", "invariant/charge-before-commit/Commit"},
			ran:     []string{"VirtualBacking/absent-means-unsupported", "SharedMapping/absent-means-unsupported", "invariant/charge-before-commit/Allocate"},
		},
		{
			name:    "no-sharing",
			cfg:     Config{Offers: memapi.Of(memapi.CapDeviceAllocator, memapi.CapVirtualBacking)},
			skipped: []string{"SharedMapping/MapView/unaligned", "SharedMapping/ReleaseReservation/in-use"},
			ran:     []string{"VirtualBacking/Commit/unaligned", "SharedMapping/absent-means-unsupported"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := conformancetest.Record(factory(c.cfg, nil))
			if failed := res.Failed(); len(failed) > 0 {
				t.Errorf("the honest mechanism failed %d subtests:\n%s", len(failed), res.Report())
			}
			if got, want := len(res.Leaves()), len(conformance.Names()); got != want {
				t.Errorf("%d subtests ran, the suite has %d", got, want)
			}
			skipped := res.Skipped()
			for _, n := range c.skipped {
				if !slices.Contains(skipped, n) {
					t.Errorf("%s was not skipped", n)
				}
			}
			for _, n := range c.ran {
				if o, ok := res.Outcome(n); !ok || o.Skipped {
					t.Errorf("%s did not run", n)
				}
			}
		})
	}
}

// TestHonestPassesChecked runs the honest mechanism through the checked
// wrapper in verify mode: the wrapper must not make a correct mechanism fail.
func TestHonestPassesChecked(t *testing.T) {
	res := conformancetest.Record(factory(Config{}, verified(nil)))
	if failed := res.Failed(); len(failed) > 0 {
		t.Errorf("the honest mechanism through checked.Wrap failed %d subtests:\n%s", len(failed), res.Report())
	}
}

// broken lists the deliberately broken mechanisms and the subtests that must
// catch each of them.
var broken = []struct {
	name     string
	wrap     func(*Mechanism) memapi.Mechanism
	mustFail []string
}{
	{
		name:     "commit-does-nothing",
		wrap:     func(m *Mechanism) memapi.Mechanism { return noopCommit{m} },
		mustFail: []string{"VirtualBacking/Commit/exact-accounting", "VirtualBacking/Commit/round-trip", "invariant/no-silent-noop/VirtualBacking"},
	},
	{
		name:     "commit-moves-counters-installs-nothing",
		wrap:     func(m *Mechanism) memapi.Mechanism { return newHollowCommit(m) },
		mustFail: []string{"invariant/no-silent-noop/VirtualBacking", "VirtualBacking/Commit/exact-accounting"},
	},
	{
		name:     "frees-foreign-handle",
		wrap:     func(m *Mechanism) memapi.Mechanism { return foreignFree{m} },
		mustFail: []string{"invariant/release-by-creator/Free"},
	},
	{
		name:     "ignores-granularity",
		wrap:     func(m *Mechanism) memapi.Mechanism { return ignoresGranularity{m} },
		mustFail: []string{"VirtualBacking/Commit/unaligned"},
	},
	{
		name:     "misreports-committed-bytes",
		wrap:     func(m *Mechanism) memapi.Mechanism { return misreportsCommitted{m} },
		mustFail: []string{"VirtualBacking/CommittedBytes/tracks-commits", "VirtualBacking/ReleaseReservation/exact-refund"},
	},
	{
		name:     "claims-unsupported-capability",
		wrap:     func(m *Mechanism) memapi.Mechanism { return claimsUnsupported{m} },
		mustFail: []string{"invariant/no-silent-noop/SharedMapping"},
	},
	{
		name:     "free-leaks-used-bytes",
		wrap:     func(m *Mechanism) memapi.Mechanism { return leakyFree{m} },
		mustFail: []string{"DeviceAllocator/Free/exact-refund", "DeviceAllocator/UsedBytes/exact-with-rounding"},
	},
	{
		name:     "double-free-succeeds",
		wrap:     func(m *Mechanism) memapi.Mechanism { return doubleFree{m} },
		mustFail: []string{"DeviceAllocator/Free/double-release"},
	},
	{
		name:     "read-only-view-writable",
		wrap:     func(m *Mechanism) memapi.Mechanism { return writableReadOnly{m} },
		mustFail: []string{"SharedMapping/MapView/read-only-refuses-writes"},
	},
	{
		name:     "copy-on-write-shares",
		wrap:     func(m *Mechanism) memapi.Mechanism { return sharedCopyOnWrite{m} },
		mustFail: []string{"SharedMapping/CopyOnWrite/private-copy", "SharedMapping/CopyOnWrite/exact-accounting"},
	},
	{
		name:     "recommit-keeps-old-bytes",
		wrap:     func(m *Mechanism) memapi.Mechanism { return dirtyRecommit{m, map[memapi.DeviceAddr][]byte{}} },
		mustFail: []string{"VirtualBacking/Commit/fresh-reads-zeros"},
	},
	{
		name:     "releases-backing-in-use",
		wrap:     func(m *Mechanism) memapi.Mechanism { return releaseInUse{m} },
		mustFail: []string{"SharedMapping/ReleaseBacking/in-use"},
	},
	{
		name:     "failed-commit-leaves-partial-state",
		wrap:     func(m *Mechanism) memapi.Mechanism { return partialCommit{m} },
		mustFail: []string{"VirtualBacking/Commit/already-committed"},
	},
}

// TestBrokenMechanismsFail is the proof that the suite can fail: every broken
// mechanism fails the subtests meant to catch its bug.
func TestBrokenMechanismsFail(t *testing.T) {
	names := conformance.Names()
	for _, b := range broken {
		t.Run(b.name, func(t *testing.T) {
			res := conformancetest.Record(factory(Config{}, b.wrap))
			failed := res.Failed()
			for _, n := range b.mustFail {
				if !slices.Contains(names, n) {
					t.Errorf("%s is not a subtest of the suite", n)
					continue
				}
				if !slices.Contains(failed, n) {
					t.Errorf("%s passed; it must catch this mechanism", n)
				}
			}
			t.Logf("%d of %d subtests failed: %s", len(failed), len(names), strings.Join(failed, ", "))
		})
	}
}

// TestCheckedWrapperCatches runs broken mechanisms through checked.Wrap in
// verify mode: the wrapper refuses the calls that break release-by-creator
// and alignment before the mechanism sees them (the suite then passes), and
// turns a commit that lies about its bytes into an ErrUntruthful failure.
func TestCheckedWrapperCatches(t *testing.T) {
	byName := map[string]func(*Mechanism) memapi.Mechanism{}
	for _, b := range broken {
		byName[b.name] = b.wrap
	}
	for _, name := range []string{"frees-foreign-handle", "ignores-granularity", "double-free-succeeds"} {
		t.Run(name+"/enforced", func(t *testing.T) {
			res := conformancetest.Record(factory(Config{}, verified(byName[name])))
			if failed := res.Failed(); len(failed) > 0 {
				t.Errorf("through the wrapper, %d subtests still failed:\n%s", len(failed), res.Report())
			}
		})
	}
	untruthful := strings.TrimPrefix(memapi.ErrUntruthful.Error(), "memapi: ")
	for _, name := range []string{"commit-does-nothing", "misreports-committed-bytes"} {
		t.Run(name+"/untruthful", func(t *testing.T) {
			res := conformancetest.Record(factory(Config{}, verified(byName[name])))
			o, ok := res.Outcome("VirtualBacking/Commit/exact-accounting")
			if !ok || !o.Failed {
				t.Fatalf("VirtualBacking/Commit/exact-accounting passed through the wrapper")
			}
			if log := strings.Join(o.Log, "\n"); !strings.Contains(log, untruthful) {
				t.Errorf("the failure does not come from the wrapper's verify mode (%q):\n%s", untruthful, log)
			}
		})
	}
}

// TestHollowCommitCaughtThroughVerify: a Commit that moves every counter but
// installs nothing passes the checked wrapper's verify mode, which reads
// those counters; the suite's witness, which reads the memory through the
// device context, still fails it.
func TestHollowCommitCaughtThroughVerify(t *testing.T) {
	res := conformancetest.Record(factory(Config{}, verified(func(m *Mechanism) memapi.Mechanism { return newHollowCommit(m) })))
	for _, n := range []string{"invariant/no-silent-noop/VirtualBacking", "VirtualBacking/Commit/exact-accounting"} {
		o, ok := res.Outcome(n)
		if !ok || !o.Failed {
			t.Errorf("%s passed through the wrapper", n)
			continue
		}
		if log := strings.Join(o.Log, "\n"); !strings.Contains(log, "Commit reported success, but") {
			t.Errorf("%s failed, but not because of the witness:\n%s", n, log)
		}
	}
}

// TestSpecDisagreementsCaught: the spec/... subtests compare the subject with
// its declaration in memapi.Meta (found by Info().Mechanism). The honest
// mechanism, presenting itself as the spec's cpu (host, every capability,
// configurable granularity), passes them; hiding a declared capability,
// running on another device than declared, or a granularity of another kind
// fails the subtest meant to catch it; a mechanism the spec does not declare
// skips them.
func TestSpecDisagreementsCaught(t *testing.T) {
	specs := []string{"spec/offers", "spec/device", "spec/granularity"}
	run := func(t *testing.T, cfg Config) *conformancetest.Results {
		t.Helper()
		return conformancetest.Record(factory(cfg, nil))
	}
	t.Run("honest", func(t *testing.T) {
		res := run(t, Config{Name: "cpu"})
		for _, n := range specs {
			if o, ok := res.Outcome(n); !ok || o.Failed || o.Skipped {
				t.Errorf("%s: %+v, want passed", n, o)
			}
		}
	})
	t.Run("undeclared", func(t *testing.T) {
		res := conformancetest.Record(func(t conformance.T) conformance.Subject {
			s := factory(Config{}, nil)(t)
			s.Declared = nil
			return s
		})
		if o, ok := res.Outcome("spec/name"); !ok || !o.Failed || !strings.Contains(strings.Join(o.Log, "\n"), "matches no mechanism the spec declares (cpu, cuda, example)") {
			t.Errorf("spec/name: %+v, want a failure naming the spec's mechanisms", o)
		}
		for _, n := range specs {
			if o, ok := res.Outcome(n); !ok || !o.Skipped {
				t.Errorf("%s: %+v, want skipped (spec/name fails) for a mechanism the spec does not declare", n, o)
			}
		}
	})
	for _, c := range []struct {
		name, subtest string
		cfg           Config
	}{
		{"hides-declared-capability", "spec/offers", Config{Name: "cpu", Offers: memapi.Of(memapi.CapDeviceAllocator, memapi.CapVirtualBacking)}},
		{"wrong-device", "spec/device", Config{Name: "cuda"}},
		{"wrong-granularity-kind", "spec/granularity", Config{Name: "cpu", Granularity: 3 << 12}},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, c.cfg)
			if o, ok := res.Outcome(c.subtest); !ok || !o.Failed {
				t.Errorf("%s passed; it must catch this mechanism", c.subtest)
			}
		})
	}
}
