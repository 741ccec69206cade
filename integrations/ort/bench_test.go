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
// through the OrtAllocator function pointers, called from C as ONNX Runtime
// calls them, in batches of allocFreeBatch timed as a whole: the memgen
// allocator (the front cache's hit: a C++ thunk and a bin of the C front
// cache under its mutex, no call into Go; front-hit-rate is the share of
// Allocs it served), against
// ONNX Runtime's BFC arena, the CPU allocator of a session created without
// env allocators (CreateAllocator on it; the benchmark checks that its
// GetStats reports arena extensions, i.e. that it is the arena), and
// against its default CPU allocator (GetAllocatorWithDefaultOptions:
// malloc, no arena). The batches alternate, in the same run;
// x-vs-ort-arena is the ratio (goal at most 1.0). two-cgo-callbacks-ns/op
// is what memgen's figure would be at least if Alloc and Free each crossed
// into Go once, as they did before the front cache: two calls from C into a
// Go function that does nothing.
func BenchmarkAllocFree(b *testing.B) {
	const size = 64 << 10
	r := newRig(b, 4<<30, Options{})
	s, err := newSession("testdata/double_relu.onnx", false, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer s.close()
	arena, err := s.allocator()
	if err != nil {
		b.Fatal(err)
	}
	defer arena.release()
	def, err := defaultAllocator()
	if err != nil {
		b.Fatal(err)
	}
	mem := r.alloc.base()
	for _, a := range []ortAllocator{mem, arena, def} { // warm every cache
		if !a.allocFreeLoop(size, allocFreeBatch) {
			b.Fatalf("warm-up refused: %v", r.alloc.LastError())
		}
	}
	if st, err := arena.stats(true); err != nil || st["NumArenaExtensions"] == 0 || st["NumAllocs"] == 0 {
		b.Fatalf("the baseline is not ONNX Runtime's arena: GetStats %v, %v", st, err)
	}
	st0 := r.alloc.Stats()
	allocs0 := st0.Allocs
	var tMem, tArena, tDef, tCallback time.Duration
	timed := func(a ortAllocator, n int, into *time.Duration) {
		t0 := time.Now()
		ok := a.allocFreeLoop(size, n)
		*into += time.Since(t0)
		if !ok {
			b.Fatalf("an allocation was refused: %v", r.alloc.LastError())
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for done, i := 0, 0; done < b.N; i++ {
		n := min(allocFreeBatch, b.N-done)
		if i%2 == 0 {
			timed(mem, n, &tMem)
			timed(arena, n, &tArena)
		} else {
			timed(arena, n, &tArena)
			timed(mem, n, &tMem)
		}
		timed(def, n, &tDef)
		t0 := time.Now()
		callbackLoop(n)
		tCallback += time.Since(t0)
		done += n
	}
	b.StopTimer()
	st := r.alloc.Stats()
	if got := st.Allocs - allocs0; got != uint64(b.N) {
		b.Errorf("%d allocations reached the memgen allocator, want %d", got, b.N)
	}
	hits := float64(st.FrontHits-st0.FrontHits) / float64(b.N)
	r.auditZero(b, "after the benchmark")
	n := float64(b.N)
	b.ReportMetric(float64(tMem.Nanoseconds())/n, "memgen-ns/op")
	b.ReportMetric(float64(tArena.Nanoseconds())/n, "ort-arena-ns/op")
	b.ReportMetric(float64(tDef.Nanoseconds())/n, "ort-default-ns/op")
	b.ReportMetric(float64(tCallback.Nanoseconds())/n, "two-cgo-callbacks-ns/op")
	b.ReportMetric(float64(tMem)/float64(tArena), "x-vs-ort-arena")
	b.ReportMetric(float64(tMem)/float64(tDef), "x-vs-ort-default")
	b.ReportMetric(hits, "front-hit-rate")
}

// allocFreeBatch is how many Alloc+Free pairs one timed batch holds.
const allocFreeBatch = 1000

// BenchmarkFanInference runs the fan-out model (128 MatMul+Relu branches
// concatenated, ort.sh's fan128dyn.onnx) with memory patterns off and a
// batch that changes every run (fanBatches), so that every run allocates
// its intermediates: alternately in a session whose allocations go through
// the memgen allocator's pool and in one on ONNX Runtime's BFC arena, one
// intra-op thread each. Only ONNX Runtime's Run is timed (inputs made
// once); each batch's median over b.N runs, summed over the batches (the
// per-run figures are that sum over len(fanBatches)). Reports
// front-hit-rate (the share of its Allocs the front cache served),
// memgen-allocs/run (goal at least 100) and x-vs-ort-arena (goal at most
// 1.03).
func BenchmarkFanInference(b *testing.B) {
	needFan(b)
	r := newRig(b, 4<<30, Options{})
	mem, err := newSessionWith(fanModel, sessEnvAllocators|sessNoMemPattern, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer mem.close()
	arena, err := newSessionWith(fanModel, sessNoMemPattern, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer arena.close()
	var pm, pa []*preparedRun
	for _, batch := range fanBatches {
		in := []tensor{fanInput(batch)}
		m, err := mem.prepare(in)
		if err != nil {
			b.Fatal(err)
		}
		defer m.close()
		a, err := arena.prepare(in)
		if err != nil {
			b.Fatal(err)
		}
		defer a.close()
		pm, pa = append(pm, m), append(pa, a)
	}
	one := func(p *preparedRun) time.Duration {
		d, err := p.run()
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	for j := range pm { // warm: both caches grow to what a round needs
		one(pm[j])
		one(pa[j])
	}
	st0 := r.alloc.Stats()
	allocs0 := st0.Allocs
	segs0 := r.alloc.Pool().Stats().SegmentAllocs
	// Every batch is run by both sessions back to back, the order swapped
	// each time, so that a change of the machine's load hits both.
	tm, ta := make([][]time.Duration, len(pm)), make([][]time.Duration, len(pm))
	b.ResetTimer()
	for i := range b.N {
		for j := range pm {
			if (i+j)%2 == 0 {
				tm[j] = append(tm[j], one(pm[j]))
				ta[j] = append(ta[j], one(pa[j]))
			} else {
				ta[j] = append(ta[j], one(pa[j]))
				tm[j] = append(tm[j], one(pm[j]))
			}
		}
	}
	b.StopTimer()
	runs := float64(b.N * len(fanBatches))
	st := r.alloc.Stats()
	perRun := float64(st.Allocs-allocs0) / runs
	var mm, ma time.Duration // sums over the batches of each batch's median
	for j := range pm {
		mm += median(tm[j])
		ma += median(ta[j])
	}
	k := float64(len(fanBatches))
	b.ReportMetric(float64(mm.Microseconds())/k, "memgen-us/run")
	b.ReportMetric(float64(ma.Microseconds())/k, "arena-us/run")
	b.ReportMetric(float64(mm)/float64(ma), "x-vs-ort-arena")
	b.ReportMetric(perRun, "memgen-allocs/run")
	b.ReportMetric(float64(st.FrontHits-st0.FrontHits)/float64(st.Allocs-allocs0), "front-hit-rate")
	ps := r.alloc.Pool().Stats()
	b.ReportMetric(ps.PeakFragmentation(), "pool-peak-held/peak-requested")
	b.ReportMetric(float64(ps.SegmentAllocs-segs0)/runs, "pool-growths/run")
	if perRun < 100 {
		b.Errorf("%.1f allocations per run through memgen, want at least 100", perRun)
	}
}
