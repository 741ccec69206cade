package checkedtest

import (
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// targets are the mechanisms the wrapper is measured over: the generated fake
// (quiet: counting calls without keeping their arguments) and this package's
// own mechanism.
var targets = []struct {
	name string
	make func() memapi.Mechanism
}{
	{"fake", func() memapi.Mechanism { return fakes.NewMechanism(fakes.Config{Authority: auth, Quiet: true}) }},
	{"testmech", func() memapi.Mechanism { return newMech(auth, 0) }},
}

// wrap wraps m as the benchmarks do: trusting this package's ledger doubles
// (benchLedger is the benchmarks' grant and account), one ledger check per
// call, as with a governor.
func wrap(m memapi.Mechanism, verify bool) memapi.Mechanism {
	return wrapWith(m, testDoubles{}, verify)
}

// wrapWith wraps m trusting l, in verify mode or not.
func wrapWith(m memapi.Mechanism, l checked.Ledger, verify bool) memapi.Mechanism {
	if verify {
		return checked.Wrap(m, l, checked.WithVerify())
	}
	return checked.Wrap(m, l)
}

// runWorkload times w.step for b.N calls, resetting untimed every batch calls.
func runWorkload(b *testing.B, w workload) {
	b.ReportAllocs()
	if err := w.reset(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	k := 0
	for i := 0; i < b.N; i++ {
		if k == batch {
			b.StopTimer()
			if err := w.reset(); err != nil {
				b.Fatal(err)
			}
			k = 0
			b.StartTimer()
		}
		if err := w.step(k); err != nil {
			b.Fatal(err)
		}
		k++
	}
}

// side is one configuration of the paired measurement.
type side struct {
	w       workload
	samples []float64 // ns per call, one per batch
}

// runBatch times n calls of the side, after an untimed reset and collection
// (so that no side pays for garbage another left behind).
func (s *side) runBatch(b *testing.B, n int) {
	b.StopTimer()
	if err := s.w.reset(); err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	b.StartTimer()
	t0 := time.Now()
	for k := range n {
		if err := s.w.step(k); err != nil {
			b.Fatal(err)
		}
	}
	s.samples = append(s.samples, float64(time.Since(t0).Nanoseconds())/float64(n))
}

// ns is the median ns per call over the batches: a batch that lost the CPU
// to another process does not move it.
func (s *side) ns() float64 {
	x := slices.Clone(s.samples)
	slices.Sort(x)
	if len(x)%2 == 1 {
		return x[len(x)/2]
	}
	return (x[len(x)/2-1] + x[len(x)/2]) / 2
}

// BenchmarkChecked measures every method through the wrapper against the
// bare mechanism, over the generated fake and over this package's own small
// mechanism (cheaper than the fake, so the wrapper's share shows more). Per
// target and method:
//   - bare, checked, verify: sibling sub-benchmarks, each with its own ns/op
//     and allocs/op;
//   - paired: the three alternate batch by batch in one loop, in rotating
//     order and each batch after a collection (so machine noise and GC fall
//     on all of them alike); each side's figure is its median ns per call
//     over the batches, and the ratio is reported from that run: x-vs-bare
//     and ns-added for the wrapper, verify-x-vs-bare for verify mode. Its own
//     ns/op is the sum of the three sides.
func BenchmarkChecked(b *testing.B) {
	for _, t := range targets {
		b.Run(t.name, func(b *testing.B) { benchTarget(b, t.make) })
	}
}

func benchTarget(b *testing.B, target func() memapi.Mechanism) {
	ledger := func() *benchLedger { return &benchLedger{authority: auth} }
	for _, w := range methodWorkloads {
		b.Run(w.name, func(b *testing.B) {
			b.Run("bare", func(b *testing.B) { runWorkload(b, w.make(target(), ledger())) })
			b.Run("checked", func(b *testing.B) { runWorkload(b, w.make(wrap(target(), false), ledger())) })
			b.Run("verify", func(b *testing.B) { runWorkload(b, w.make(wrap(target(), true), ledger())) })
			b.Run("paired", func(b *testing.B) {
				sides := []*side{
					{w: w.make(target(), ledger())},
					{w: w.make(wrap(target(), false), ledger())},
					{w: w.make(wrap(target(), true), ledger())},
				}
				b.ResetTimer()
				for round, done := 0, 0; done < b.N; round, done = round+1, done+batch {
					n := min(batch, b.N-done)
					for i := range sides { // rotate the order, so no side always goes first
						sides[(round+i)%len(sides)].runBatch(b, n)
					}
				}
				bare, chk, ver := sides[0].ns(), sides[1].ns(), sides[2].ns()
				b.ReportMetric(bare, "bare-ns/call")
				b.ReportMetric(chk, "checked-ns/call")
				b.ReportMetric(chk/bare, "x-vs-bare")
				b.ReportMetric(chk-bare, "ns-added")
				b.ReportMetric(ver/bare, "verify-x-vs-bare")
			})
		})
	}
}
