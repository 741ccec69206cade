package ort

import (
	"os"
	"slices"
	"testing"
	"time"

	ortgo "github.com/yalue/onnxruntime_go"
)

// BenchmarkMLPInference runs the 24-layer MLP of width 2048 (batch 64)
// that ort.sh builds, through onnxruntime_go, alternately in a session with
// ONNX Runtime's default CPU arena and in one whose allocations go through
// the memgen allocator, and reports both latencies and their ratio
// (x-vs-ort-arena; the goal is at most 1.05). One intra-op thread each, so
// that the two do not compete for cores.
func BenchmarkMLPInference(b *testing.B) {
	if _, err := os.Stat(benchPath); err != nil {
		b.Fatalf("%v: run `make ort-bench` to build it", err)
	}
	r := newRig(b, 4<<30, Options{})
	const batch, width = 64, 2048
	x := make([]float32, batch*width)
	for i := range x {
		x[i] = float32(i%97)/97 - 0.5
	}
	in, err := ortgo.NewTensor(ortgo.NewShape(batch, width), x)
	if err != nil {
		b.Fatal(err)
	}
	defer in.Destroy()
	open := func(governed bool) *ortgo.DynamicAdvancedSession {
		var o *ortgo.SessionOptions
		var err error
		if governed {
			o, err = SessionOptions()
		} else {
			o, err = ortgo.NewSessionOptions()
		}
		if err != nil {
			b.Fatal(err)
		}
		defer o.Destroy()
		if err := o.SetIntraOpNumThreads(1); err != nil {
			b.Fatal(err)
		}
		s, err := ortgo.NewDynamicAdvancedSession(benchPath, []string{"x"}, []string{"y"}, o)
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	arena, governed := open(false), open(true)
	run := func(s *ortgo.DynamicAdvancedSession) time.Duration {
		out := []ortgo.Value{nil} // allocated by the session's allocator
		t0 := time.Now()
		if err := s.Run([]ortgo.Value{in}, out); err != nil {
			b.Fatal(err)
		}
		d := time.Since(t0)
		out[0].Destroy()
		return d
	}
	run(arena) // warm both: first runs plan memory patterns
	run(governed)
	allocs0 := r.alloc.Stats().Allocs
	var tArena, tGoverned []time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Alternate the order so that neither always runs second.
		if i%2 == 0 {
			tArena = append(tArena, run(arena))
			tGoverned = append(tGoverned, run(governed))
		} else {
			tGoverned = append(tGoverned, run(governed))
			tArena = append(tArena, run(arena))
		}
	}
	b.StopTimer()
	st := r.alloc.Stats()
	if err := arena.Destroy(); err != nil {
		b.Error(err)
	}
	if err := governed.Destroy(); err != nil {
		b.Error(err)
	}
	r.auditZero(b, "sessions destroyed")
	// Medians: the machine is shared, and one preempted run would swing a
	// mean.
	ma, mg := median(tArena), median(tGoverned)
	b.ReportMetric(float64(ma.Microseconds())/1e3, "arena-ms/run")
	b.ReportMetric(float64(mg.Microseconds())/1e3, "memgen-ms/run")
	b.ReportMetric(float64(mg)/float64(ma), "x-vs-ort-arena")
	b.ReportMetric(float64(st.Allocs-allocs0)/float64(b.N), "memgen-allocs/run")
	b.ReportMetric(float64(st.PeakBytes)/(1<<20), "memgen-peak-MiB")
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkAllocFree measures one Alloc and one Free of a 64 KiB block
// through the OrtAllocator function pointers, as ONNX Runtime calls them:
// the memgen allocator (reserve, commit, mmap and populate, the charge;
// the free is enqueued and happens on the deferred-free queue) against ONNX
// Runtime's default CPU allocator (malloc). The queue is drained outside
// the timing every 256 blocks; settle-ns/op is what that drain costs per
// block.
func BenchmarkAllocFree(b *testing.B) {
	r := newRig(b, 4<<30, Options{})
	const size = 64 << 10
	var tMem, tDef, tSettle time.Duration
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		p := r.alloc.cAlloc(size)
		if p == nil {
			b.Fatal(r.alloc.LastError())
		}
		r.alloc.cFree(p)
		t1 := time.Now()
		q := defaultAlloc(size)
		if q == nil {
			b.Fatal("ONNX Runtime's default allocator failed")
		}
		defaultFree(q)
		t2 := time.Now()
		tMem += t1.Sub(t0)
		tDef += t2.Sub(t1)
		if i%256 == 255 {
			r.settle(b)
			tSettle += time.Since(t2)
		}
	}
	b.StopTimer()
	r.auditZero(b, "after the benchmark")
	n := float64(b.N)
	b.ReportMetric(float64(tMem.Nanoseconds())/n, "memgen-ns/op")
	b.ReportMetric(float64(tDef.Nanoseconds())/n, "ort-default-ns/op")
	b.ReportMetric(float64(tSettle.Nanoseconds())/n, "settle-ns/op")
	b.ReportMetric(float64(tMem)/float64(tDef), "x-vs-ort-default")
}
