package pmm_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// timedCPU is the CPU mechanism with the time spent in its Allocate and
// Free added up: what a governed call spends in the mechanism, so that the
// rest of the call is the manager's, the governor's and the lifecycle's.
type timedCPU struct {
	*cpu.Mechanism
	in time.Duration
}

func (t *timedCPU) Allocate(ctx context.Context, r memapi.AllocRequest, g memapi.Grant) (*memapi.Allocation, error) {
	t0 := time.Now()
	a, err := t.Mechanism.Allocate(ctx, r, g)
	t.in += time.Since(t0)
	return a, err
}

func (t *timedCPU) Free(ctx context.Context, a *memapi.Allocation, acct memapi.Account) error {
	t0 := time.Now()
	err := t.Mechanism.Free(ctx, a, acct)
	t.in += time.Since(t0)
	return err
}

// BenchmarkAllocateCloseShare splits a governed Allocate+Close over the CPU
// mechanism into the mechanism's time inside it and the rest (the share of
// pmm, the governor, the checked wrapper and the lifecycle), against the
// bare Allocate+Free alternating with it, as medians over the run's
// operations (the mean that BenchmarkAllocateClose gives carries the
// kernel's outliers). The timing adds two clock reads to each governed
// mechanism call, counted in the rest.
func BenchmarkAllocateCloseShare(b *testing.B) {
	for _, size := range []memapi.Bytes{4 << 10, 64 << 10, 2 << 20} {
		b.Run(fmt.Sprintf("cpu/%dKiB", size>>10), func(b *testing.B) {
			m, err := cpu.New(cpu.Options{Granularity: 4096, Authority: hostAuth})
			if err != nil {
				b.Fatal(err)
			}
			tm := &timedCPU{Mechanism: m}
			e := newBenchEnvOn(b, tm, cpu.NewContext(m), nil)
			ctx := context.Background()
			bare := make([]time.Duration, 0, b.N)
			governed := make([]time.Duration, 0, b.N)
			inside := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				a, err := m.Allocate(ctx, memapi.AllocRequest{Size: size}, bareGrant{})
				if err != nil {
					b.Fatal(err)
				}
				if err := m.Free(ctx, a, bareGrant{}); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				tm.in = 0
				buf, err := e.b.Allocate(ctx, size)
				if err != nil {
					b.Fatal(err)
				}
				if err := buf.Close(); err != nil {
					b.Fatal(err)
				}
				if err := e.ectx.Queue().Drain(ctx); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				bare = append(bare, t1.Sub(t0))
				governed = append(governed, t2.Sub(t1))
				inside = append(inside, tm.in)
			}
			b.StopTimer()
			rest := make([]time.Duration, len(governed))
			for i := range governed {
				rest[i] = governed[i] - inside[i]
			}
			mb, mg := median(bare), median(governed)
			b.ReportMetric(float64(mb.Nanoseconds()), "bare-p50-ns")
			b.ReportMetric(float64(mg.Nanoseconds()), "governed-p50-ns")
			b.ReportMetric(float64(median(inside).Nanoseconds()), "mechanism-p50-ns")
			b.ReportMetric(float64(median(rest).Nanoseconds()), "rest-p50-ns")
			b.ReportMetric(float64(mg)/float64(mb), "p50-x-vs-bare")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
