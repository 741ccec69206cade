package governor

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
)

// pmmCycle is the cycle as the physical memory manager runs it: reserve,
// draw (the checked wrapper), commit, mark the lease pending at release
// (its free waits for fences), refund once the free happened.
func pmmCycle(b *testing.B, g *Governor, ctx context.Context) {
	gr, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "bench", Role: "bench", Bytes: benchBytes})
	if err != nil {
		b.Fatal(err)
	}
	if err := gr.Draw(benchBytes); err != nil {
		b.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		b.Fatal(err)
	}
	if err := l.MarkPending(benchBytes); err != nil {
		b.Fatal(err)
	}
	if err := l.Refund(benchBytes); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCyclePending runs pmmCycle against a semaphore's Acquire and
// Release, uncontended and from every P at once, as BenchmarkCycle does.
func BenchmarkCyclePending(b *testing.B) {
	ctx := context.Background()
	b.Run("uncontended", func(b *testing.B) {
		g := benchGovernor(b)
		s := semaphore.NewWeighted(1 << 50)
		const chunk = 512
		var gov, sem time.Duration
		b.ReportAllocs()
		b.ResetTimer()
		for done := 0; done < b.N; done += chunk {
			n := min(chunk, b.N-done)
			t0 := time.Now()
			for range n {
				semaphoreCycle(b, s, ctx)
			}
			t1 := time.Now()
			for range n {
				pmmCycle(b, g, ctx)
			}
			gov += time.Since(t1)
			sem += t1.Sub(t0)
		}
		report(b, gov, sem, b.N)
	})
	b.Run("parallel", func(b *testing.B) {
		g := benchGovernor(b)
		s := semaphore.NewWeighted(1 << 50)
		b.ReportAllocs()
		b.ResetTimer()
		t0 := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				semaphoreCycle(b, s, ctx)
			}
		})
		t1 := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				pmmCycle(b, g, ctx)
			}
		})
		report(b, time.Since(t1), t1.Sub(t0), b.N)
	})
}
