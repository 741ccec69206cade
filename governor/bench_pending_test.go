package governor

import (
	"context"
	"testing"
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
// Release, as BenchmarkCycle does.
func BenchmarkCyclePending(b *testing.B) { benchCycle(b, pmmCycle) }
