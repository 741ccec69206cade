package pmm_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/pmm"
)

// BenchmarkRecordSites is what Options.RecordSites costs an Allocate+Close
// over the fake mechanism: the same cycle with sites off and on, in
// alternating blocks of 256, in one run. It reports each one's ns/op, the
// site's cost (site-ns, on less off) and the allocations it adds per
// Allocate (site-allocs).
func BenchmarkRecordSites(b *testing.B) {
	ctx := context.Background()
	bind := func(sites bool) *pmm.Binding {
		m := fakes.NewMechanism(fakes.Config{Authority: hostAuth})
		return newBenchEnvOn(b, m, fakes.NewContext(m), nil, pmm.Options{RecordSites: sites}).b
	}
	off, on := bind(false), bind(true)
	cycle := func(bd *pmm.Binding) {
		buf, err := bd.Allocate(ctx, 4096)
		if err != nil {
			b.Fatal(err)
		}
		if err := buf.Close(); err != nil {
			b.Fatal(err)
		}
	}
	var tOff, tOn time.Duration
	var nOff, nOn int
	b.ResetTimer()
	for done := 0; done < b.N; {
		for _, side := range []bool{false, true} {
			bd, t := off, &tOff
			if side {
				bd, t = on, &tOn
			}
			k := min(256, b.N-done)
			start := time.Now()
			for range k {
				cycle(bd)
			}
			*t += time.Since(start)
			if side {
				nOn += k
			} else {
				nOff += k
			}
		}
		done += min(256, b.N-done)
	}
	b.StopTimer()
	aOff := testing.AllocsPerRun(100, func() { cycle(off) })
	aOn := testing.AllocsPerRun(100, func() { cycle(on) })
	b.ReportMetric(float64(tOff.Nanoseconds())/float64(nOff), "off-ns/op")
	b.ReportMetric(float64(tOn.Nanoseconds())/float64(nOn), "on-ns/op")
	b.ReportMetric(float64(tOn.Nanoseconds())/float64(nOn)-float64(tOff.Nanoseconds())/float64(nOff), "site-ns")
	b.ReportMetric(aOn-aOff, "site-allocs")
}
