package governor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"golang.org/x/sync/semaphore"
)

// The budget a Go user would otherwise pick: a weighted semaphore. Both
// sides of each comparison run alternately in the same benchmark and the
// ratio is reported as x-vs-semaphore (governor time / semaphore time).

const benchBytes memapi.Bytes = 2 << 20

func benchGovernor(b *testing.B) *Governor {
	b.Helper()
	g := New(Options{})
	if err := g.AddAuthority(hostA, 1<<50); err != nil {
		b.Fatal(err)
	}
	if err := g.Register("bench", nil, HolderOptions{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	return g
}

// governorCycle is the full accounting of one allocation: reserve a grant,
// draw it (as the checked wrapper does), commit it to a lease, refund the
// lease when the memory is freed.
func governorCycle(b *testing.B, g *Governor, ctx context.Context) {
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
	if err := l.Refund(benchBytes); err != nil {
		b.Fatal(err)
	}
}

func semaphoreCycle(b *testing.B, s *semaphore.Weighted, ctx context.Context) {
	if err := s.Acquire(ctx, int64(benchBytes)); err != nil {
		b.Fatal(err)
	}
	s.Release(int64(benchBytes))
}

func report(b *testing.B, gov, sem time.Duration, ops int) {
	govNs := float64(gov.Nanoseconds()) / float64(ops)
	semNs := float64(sem.Nanoseconds()) / float64(ops)
	b.ReportMetric(govNs, "ns/op") // the governor's, replacing the mixed figure
	b.ReportMetric(semNs, "semaphore-ns/op")
	b.ReportMetric(govNs/semNs, "x-vs-semaphore")
}

// BenchmarkCycle runs the public reservation cycle (governorCycle: Reserve,
// Draw, Commit and Refund) against a semaphore's Acquire and Release, each
// side called the same way. The ratio is printed, not judged: a semaphore
// keeps one number, the governor a ledger per holder and a record per
// reservation.
func BenchmarkCycle(b *testing.B) { benchCycle(b, governorCycle) }

// benchCycle runs cycle against a semaphore's Acquire and Release,
// alternating in one run: uncontended, and from every P at once.
func benchCycle(b *testing.B, cycle func(*testing.B, *Governor, context.Context)) {
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
				cycle(b, g, ctx)
			}
			gov += time.Since(t1)
			sem += t1.Sub(t0)
		}
		report(b, gov, sem, b.N)
	})
	b.Run("parallel", func(b *testing.B) {
		// Every P contends for the one authority (and the one semaphore).
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
				cycle(b, g, ctx)
			}
		})
		report(b, time.Since(t1), t1.Sub(t0), b.N)
	})
}

// BenchmarkRefundToWake measures the latency from a refund to the return of
// the reservation it serves, against the same hand-off through a bare
// channel (the floor: one goroutine waking another).
func BenchmarkRefundToWake(b *testing.B) {
	waiting := make(chan struct{}, 1)
	g := New(Options{OnEvent: func(e Event) {
		if e.Kind == EventWaiting {
			waiting <- struct{}{}
		}
	}})
	defer g.Close()
	if err := g.AddAuthority(hostA, benchBytes); err != nil {
		b.Fatal(err)
	}
	if err := g.Register("bench", nil, HolderOptions{}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// Take the whole authority before the waiter starts, so it waits.
	gr, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "bench", Role: "", Bytes: benchBytes})
	if err != nil {
		b.Fatal(err)
	}
	if err := gr.Draw(benchBytes); err != nil {
		b.Fatal(err)
	}
	held, err := gr.Commit()
	if err != nil {
		b.Fatal(err)
	}

	type woke struct {
		at time.Time
		l  Lease
	}
	govWoke := make(chan woke)
	chanReady, chanWake, chanWoke := make(chan struct{}), make(chan struct{}), make(chan time.Time)
	stop := make(chan struct{})
	done := make(chan struct{}, 2)
	go func() { // the waiting reservation
		defer func() { done <- struct{}{} }()
		for {
			gr, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "bench", Role: "", Bytes: benchBytes})
			at := time.Now()
			if err != nil {
				return // the governor closed
			}
			if err := gr.Draw(benchBytes); err != nil {
				panic(err)
			}
			l, err := gr.Commit()
			if err != nil {
				panic(err)
			}
			govWoke <- woke{at, l}
		}
	}()
	go func() { // the baseline waiter
		defer func() { done <- struct{}{} }()
		for {
			select {
			case chanReady <- struct{}{}:
			case <-stop:
				return
			}
			<-chanWake
			chanWoke <- time.Now()
		}
	}()

	govLat := make([]time.Duration, 0, b.N)
	chanLat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		<-waiting
		t0 := time.Now()
		if err := held.Refund(benchBytes); err != nil {
			b.Fatal(err)
		}
		w := <-govWoke
		govLat = append(govLat, w.at.Sub(t0))
		held = w.l

		<-chanReady
		t0 = time.Now()
		chanWake <- struct{}{}
		chanLat = append(chanLat, (<-chanWoke).Sub(t0))
	}
	b.StopTimer()
	close(stop)
	<-waiting
	g.Close()
	<-done
	<-done
	held.release()

	p := func(lat []time.Duration, q float64) float64 {
		slices.Sort(lat)
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds())
	}
	gp50, gp99 := p(govLat, 0.50), p(govLat, 0.99)
	cp50, cp99 := p(chanLat, 0.50), p(chanLat, 0.99)
	b.ReportMetric(gp50, "p50-ns")
	b.ReportMetric(gp99, "p99-ns")
	b.ReportMetric(cp50, "chan-p50-ns")
	b.ReportMetric(cp99, "chan-p99-ns")
	b.ReportMetric(gp50/cp50, "p50-x-vs-chan")
}
