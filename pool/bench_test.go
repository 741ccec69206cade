package pool_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
)

// benchEnv is a pool and its binding over the CPU mechanism, governed.
func benchEnv(b *testing.B, capacity memapi.Bytes) (*pool.Pool, *pmm.Binding, func()) {
	return benchEnvWith(pool.Options{})(b, capacity)
}

// benchEnvWith is benchEnv with the pool's options.
func benchEnvWith(opts pool.Options) func(*testing.B, memapi.Bytes) (*pool.Pool, *pmm.Binding, func()) {
	return func(b *testing.B, capacity memapi.Bytes) (*pool.Pool, *pmm.Binding, func()) {
		b.Helper()
		m, err := cpu.New(cpu.Options{Granularity: 64 << 10, Authority: auth})
		if err != nil {
			b.Fatal(err)
		}
		return benchOn(b, capacity, m, cpu.NewContext(m), dev0, opts, func() {})
	}
}

// cudaEnv is benchEnv on the CUDA mechanism over the simulated driver.
func cudaEnv(b *testing.B, capacity memapi.Bytes) (*pool.Pool, *pmm.Binding, func()) {
	b.Helper()
	// 64 GiB of simulated device memory: the unpooled run's cuMemAlloc
	// blocks are charged whole 2 MiB pages each (the simulator's host
	// memory is only what the blocks ask for).
	sim := cudasim.New(cudasim.Config{Memory: 64 << 30})
	m, err := cuda.New(cuda.Config{Driver: sim.Table(), Authority: auth})
	must(b, err)
	dc, err := m.NewContext()
	must(b, err)
	return benchOn(b, capacity, m, dc, memapi.DeviceKey{Kind: memapi.DeviceKindCUDA, Ordinal: 0}, pool.Options{}, func() { _ = m.Close() })
}

// lastGov is the governor of the latest benchOn (benchmarks run one at a time).
var lastGov *governor.Governor

func benchOn(b *testing.B, capacity memapi.Bytes, m memapi.Mechanism, dc memapi.DeviceContext, key memapi.DeviceKey, opts pool.Options, closeMech func()) (*pool.Pool, *pmm.Binding, func()) {
	ectx := ep.NewContext(dc, ep.Options{})
	g := governor.New(governor.Options{})
	lastGov = g
	must(b, g.AddAuthority(auth, capacity))
	mgr := pmm.New(g, pmm.Options{})
	must(b, mgr.Register(pmm.Device{Key: key, Mechanism: m, Context: ectx, Authority: auth}))
	dev0 := key
	bp, err := mgr.Bind("pool", "workspace", dev0)
	must(b, err)
	bb, err := mgr.Bind("bare", "workspace", dev0)
	must(b, err)
	p, err := pool.New(bp, opts)
	must(b, err)
	must(b, g.Register("pool", p, governor.HolderOptions{Cache: true}))
	must(b, g.Register("bare", nil, governor.HolderOptions{}))
	return p, bb, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		must(b, p.Close())
		must(b, mgr.Close(ctx))
		must(b, ectx.Close(ctx, true))
		must(b, g.Close())
		closeMech()
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// rmmOp is one step of RMM's random_allocations: an allocation of size
// bytes, or (size 0) the free of the live allocation at index victim.
type rmmOp struct {
	size   memapi.Bytes
	victim int
}

// rmmPattern is RMM's random_allocations benchmark
// (benchmarks/random_allocations/random_allocations.cpp): 2n steps; each
// draws a size uniform in [1, maxSize] and allocates it with probability
// 73% while fewer than n were made and the live bytes plus the size stay
// under maxUsage, and otherwise frees a live allocation drawn at random.
// The allocations here never fail (the benchmarks' budgets are above
// maxUsage), so the steps do not depend on the allocator and are drawn
// once, for the pool and the unpooled binding alike.
func rmmPattern(seed uint64, n int, maxSize, maxUsage memapi.Bytes) []rmmOp {
	r := rand.New(rand.NewPCG(seed, 9))
	var ops []rmmOp
	live, made := 0, 0
	var usage memapi.Bytes
	var sizes []memapi.Bytes
	for range 2 * n {
		size := memapi.Bytes(1 + r.Uint64N(uint64(maxSize)))
		alloc := true
		if live > 0 {
			alloc = r.IntN(100) < 73 && made < n && usage+size < maxUsage
		}
		switch {
		case alloc:
			ops = append(ops, rmmOp{size: size})
			sizes = append(sizes, size)
			usage += size
			live++
			made++
		case live > 0:
			i := r.IntN(live)
			ops = append(ops, rmmOp{victim: i})
			usage -= sizes[i]
			sizes[i] = sizes[live-1]
			sizes = sizes[:live-1]
			live--
		}
	}
	for live > 0 { // what RMM's loop leaves live is freed at the end
		ops = append(ops, rmmOp{victim: live - 1})
		live--
	}
	return ops
}

// runOps replays ops: the victim of a free is swapped with the last live
// allocation and dropped, as RMM's remove_at does.
func runOps[T any](ops []rmmOp, alloc func(memapi.Bytes) T, free func(T)) {
	var live []T
	for _, op := range ops {
		if op.size > 0 {
			live = append(live, alloc(op.size))
			continue
		}
		free(live[op.victim])
		live[op.victim] = live[len(live)-1]
		live = live[:len(live)-1]
	}
}

// steadyPattern is a harsher variant held at its bound: n allocations of
// sizes up to maxSize, each made after random live ones are freed until it
// fits under bound, so that every allocation after the first bound's worth
// lands in a region of holes.
func steadyPattern(seed uint64, n int, maxSize, bound memapi.Bytes) []rmmOp {
	sizes := rand.New(rand.NewPCG(seed, 7))
	r := rand.New(rand.NewPCG(3, 4))
	var ops []rmmOp
	var live []memapi.Bytes
	var held memapi.Bytes
	for range n {
		size := memapi.Bytes(1 + sizes.Uint64N(uint64(maxSize)))
		for held+size > bound && len(live) > 0 {
			i := r.IntN(len(live))
			ops = append(ops, rmmOp{victim: i})
			held -= live[i]
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		}
		ops = append(ops, rmmOp{size: size})
		live = append(live, size)
		held += size
	}
	for len(live) > 0 {
		ops = append(ops, rmmOp{victim: len(live) - 1})
		live = live[:len(live)-1]
	}
	return ops
}

// BenchmarkRandomAllocations runs RMM's random_allocations pattern
// (rmmPattern: 10,000 allocations up to 1 MiB) through the pool and
// through the unpooled binding, on the CPU mechanism and on the CUDA
// mechanism over the simulated driver, and reports the ratio and the
// pool's peak fragmentation (peak held / peak requested):
//   - rmm: RMM's own bound, max_usage 16000 MiB (10,000 allocations of
//     at most 1 MiB never reach it: about 3 GiB live at the peak);
//   - rmm-1GiB: RMM's pattern with max_usage 1 GiB, which it reaches and
//     then stays near;
//   - steady-64MiB: steadyPattern at 64 MiB, 64 times the largest size:
//     random holes everywhere, where no best-fit allocator over one
//     address range stays under about 1.22 (docs/pool.md); cpu-holes is
//     the CPU with Options.HoleSlack 1/20 there (whole free granules
//     decommitted before the committed bytes rise: fewer bytes held, for
//     the kernel's page zeroing at each recommit).
func BenchmarkRandomAllocations(b *testing.B) {
	rmm := rmmPattern(1, 10000, 1<<20, 16000<<20)
	rmm1 := rmmPattern(1, 10000, 1<<20, 1<<30)
	steady := steadyPattern(1, 10000, 1<<20, 64<<20)
	for _, c := range []struct {
		name string
		ops  []rmmOp
	}{{"rmm", rmm}, {"rmm-1GiB", rmm1}, {"steady-64MiB", steady}} {
		b.Run(c.name+"/cpu", func(b *testing.B) { randomAllocations(b, c.ops, benchEnv) })
		b.Run(c.name+"/cudasim", func(b *testing.B) { randomAllocations(b, c.ops, cudaEnv) })
	}
	b.Run("steady-64MiB/cpu-holes", func(b *testing.B) {
		randomAllocations(b, steady, benchEnvWith(pool.Options{HoleSlack: 1.0 / 20}))
	})
}

func randomAllocations(b *testing.B, ops []rmmOp, mk func(*testing.B, memapi.Bytes) (*pool.Pool, *pmm.Binding, func())) {
	p, bare, done := mk(b, 64<<30) // a budget no pattern reaches: the unpooled CUDA run is charged 2 MiB a block
	defer done()
	ctx := context.Background()
	allocs := 0
	for _, op := range ops {
		if op.size > 0 {
			allocs++
		}
	}
	bareRun := func() {
		runOps(ops, func(n memapi.Bytes) *pmm.Buffer {
			buf, err := bare.Allocate(ctx, n)
			must(b, err)
			return buf
		}, func(buf *pmm.Buffer) { must(b, buf.Close()) })
	}
	// Untimed, first: the memory both runs will touch is touched once, so
	// that neither pays what a VM's first touch of a page costs (the host
	// backing it) and the other does not.
	bareRun()
	var tPool, tBare time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		runOps(ops, func(n memapi.Bytes) pool.Block {
			blk, err := p.Alloc(ctx, n, nil)
			must(b, err)
			return blk
		}, func(blk pool.Block) { must(b, blk.Free()) })
		t1 := time.Now()
		_, err := p.Trim(ctx) // the unpooled run gets the memory back
		must(b, err)
		t2 := time.Now()
		bareRun()
		t3 := time.Now()
		tPool += t1.Sub(t0)
		tBare += t3.Sub(t2)
	}
	s := p.Stats()
	n := float64(b.N) * float64(allocs)
	b.ReportMetric(float64(tPool)/n, "pool-ns/alloc")
	b.ReportMetric(float64(tBare)/n, "bare-ns/alloc")
	b.ReportMetric(float64(tPool)/float64(tBare), "x-vs-unpooled")
	b.ReportMetric(s.PeakFragmentation(), "peak-held/peak-requested")
	b.ReportMetric(float64(s.PeakRequested)/(1<<20), "peak-requested-MiB")
	b.ReportMetric(float64(s.Decommits), "decommit-passes")
	b.ReportMetric(float64(s.Recommits), "recommits")
}

// BenchmarkSmallAllocFree: one Alloc+Free of sizes up to 64 KiB, through the
// pool and through the unpooled binding (the ratio), uncontended.
func BenchmarkSmallAllocFree(b *testing.B) {
	p, bare, done := benchEnv(b, 1<<30)
	defer done()
	ctx := context.Background()
	sizes := []memapi.Bytes{256, 4096, 20000, 65536}
	for _, n := range sizes { // warm the cache
		blk, err := p.Alloc(ctx, n, nil)
		must(b, err)
		must(b, blk.Free())
	}
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		blk, err := p.Alloc(ctx, sizes[i&3], nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := blk.Free(); err != nil {
			b.Fatal(err)
		}
	}
	tPool := time.Since(t0)
	b.StopTimer()
	const bareN = 200
	t1 := time.Now()
	for i := range bareN {
		buf, err := bare.Allocate(ctx, sizes[i&3])
		must(b, err)
		must(b, buf.Close())
	}
	tBare := time.Since(t1)
	perPool := float64(tPool) / float64(b.N)
	b.ReportMetric(perPool, "pool-ns/op")
	b.ReportMetric(perPool/(float64(tBare)/bareN), "x-vs-unpooled")
}

// BenchmarkSmallAllocFreeContended: the same with two goroutines, reported
// against one goroutine's cost in the same run. One and two goroutines run
// in alternation, five rounds each, and each figure is the best round: on a
// shared machine a round that another process interrupted says nothing of
// the pool. On two cores with other load, two goroutines may get less than
// two cores' time: the ratio is then an upper bound.
func BenchmarkSmallAllocFreeContended(b *testing.B) {
	p, _, done := benchEnv(b, 1<<30)
	defer done()
	ctx := context.Background()
	loop := func(n int) {
		for i := range n {
			blk, err := p.Alloc(ctx, memapi.Bytes(256<<(i&7)), nil)
			if err != nil {
				panic(err)
			}
			if err := blk.Free(); err != nil {
				panic(err)
			}
		}
	}
	loop(1000)
	const rounds = 5
	var one, two, cpuOne, cpuTwo time.Duration
	for r := range rounds {
		c0, t0 := cpuTime(), time.Now()
		loop(b.N)
		d1, c1 := time.Since(t0), cpuTime()-c0
		var wg sync.WaitGroup
		c0, t1 := cpuTime(), time.Now()
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); loop(b.N) }()
		}
		wg.Wait()
		d2, c2 := time.Since(t1), cpuTime()-c0
		if r == 0 || d1 < one {
			one, cpuOne = d1, c1
		}
		if r == 0 || d2 < two {
			two, cpuTwo = d2, c2
		}
	}
	// Wall time: what each goroutine waits. CPU time per op (the process's,
	// over both goroutines' ops): what contention costs (a bouncing cache
	// line, a lock), whatever share of the cores the machine gives.
	b.ReportMetric(float64(one)/float64(b.N), "one-ns/op")
	b.ReportMetric(float64(two)/float64(b.N), "two-ns/op")
	b.ReportMetric(float64(two)/float64(one), "x-vs-uncontended")
	b.ReportMetric(float64(cpuTwo)/float64(2*b.N)/(float64(cpuOne)/float64(b.N)), "cpu-x-vs-uncontended")
	b.ReportMetric(float64(p.Stats().PeakSyncs)/float64(rounds*3*b.N+1000), "peak-syncs/alloc")
}

// BenchmarkSmallCrossFree: a producer allocates small blocks that a
// consumer goroutine frees (handed over in batches of 64), against the
// same allocations freed by the producer itself, in the same run. The
// consumer's frees lower its own shard's share while the producer's only
// grows, so near the peak the producer's Allocs sync (tally.go):
// peak-syncs/alloc says how often, x-vs-same-goroutine what it costs.
func BenchmarkSmallCrossFree(b *testing.B) {
	p, _, done := benchEnv(b, 1<<30)
	defer done()
	ctx := context.Background()
	const batch = 64
	alloc := func(buf []pool.Block) {
		for i := range buf {
			blk, err := p.Alloc(ctx, memapi.Bytes(256<<(i&7)), nil)
			if err != nil {
				panic(err)
			}
			buf[i] = blk
		}
	}
	free := func(buf []pool.Block) {
		for _, blk := range buf {
			if err := blk.Free(); err != nil {
				panic(err)
			}
		}
	}
	same := func(n int) time.Duration {
		buf := make([]pool.Block, batch)
		t0 := time.Now()
		for range n / batch {
			alloc(buf)
			free(buf)
		}
		return time.Since(t0)
	}
	cross := func(n int) (time.Duration, uint64) {
		s0 := p.Stats().PeakSyncs
		ch := make(chan []pool.Block, 2)
		back := make(chan []pool.Block, 3)
		for range 3 {
			back <- make([]pool.Block, batch)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for buf := range ch {
				free(buf)
				back <- buf
			}
		}()
		t0 := time.Now()
		for range n / batch {
			buf := <-back
			alloc(buf)
			ch <- buf
		}
		close(ch)
		wg.Wait()
		return time.Since(t0), p.Stats().PeakSyncs - s0
	}
	same(1 << 12)
	var tSame, tCross time.Duration
	var syncs uint64
	b.ResetTimer()
	for r := range 3 {
		d := same(b.N)
		c, sy := cross(b.N)
		if r == 0 || d < tSame {
			tSame = d
		}
		if r == 0 || c < tCross {
			tCross, syncs = c, sy
		}
	}
	b.StopTimer()
	ops := float64(b.N / batch * batch)
	b.ReportMetric(float64(tSame.Nanoseconds())/ops, "same-ns/op")
	b.ReportMetric(float64(tCross.Nanoseconds())/ops, "cross-ns/op")
	b.ReportMetric(float64(tCross)/float64(tSame), "x-vs-same-goroutine")
	b.ReportMetric(float64(syncs)/ops, "peak-syncs/alloc")
}

// cpuTime is the process's user and system time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPressureToRefund: a ticket asks for the cached bytes; the time
// until the governor sees them refunded (p50, p99), on the CPU mechanism
// (its region's free tail). The ticket asks for all of them: a ticket for
// less takes only the tail's last granules that hold it.
func BenchmarkPressureToRefund(b *testing.B) {
	p, _, done := benchEnv(b, 1<<30)
	defer done()
	charged := func() memapi.Bytes {
		for _, h := range lastGov.Snapshot().Holders {
			if h.ID == "pool" && len(h.Authorities) > 0 {
				return h.Authorities[0].Charged + h.Authorities[0].Pending
			}
		}
		return 0
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		blk, err := p.Alloc(ctx, 2<<20, nil)
		must(b, err)
		must(b, blk.Free())
		t0 := time.Now()
		n, err := p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 2 << 20})
		must(b, err)
		if n == 0 {
			b.Fatal("nothing reclaimed")
		}
		for charged() != 0 {
			time.Sleep(time.Microsecond)
		}
		lat = append(lat, time.Since(t0))
	}
	slicesSort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
