package cuda

import (
	"flag"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// chunkBytes is the chunk the published VMM figures are quoted for.
const chunkBytes = 2 << 20

var growChunks = flag.Int("cuda.grow-chunks", 16, "chunks BenchmarkGrowth grows a buffer to")

func benchMech(b *testing.B, cfg Config) *Mechanism {
	b.Helper()
	m, _ := newMech(b, cudasim.Config{Memory: 16 << 30}, cfg)
	if !m.offers(memapi.CapVirtualBacking) {
		b.Skip("the device has no VMM")
	}
	return m
}

func perOp(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(n) }

// BenchmarkVMMChunk times each VMM call on one 2 MiB chunk (or the device
// granularity when larger), on the device thread so the thread hand-off is
// not in the figures: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap,
// cuMemRelease, and cuMemAlloc/cuMemFree of the same size as the baseline.
func BenchmarkVMMChunk(b *testing.B) {
	m := benchMech(b, Config{PoolChunks: -1})
	size, _ := roundUp(chunkBytes, m.gran)
	var create, mapping, access, unmap, release, alloc, free time.Duration
	b.ResetTimer()
	err := m.dev.do(func(t *driver.Table) error {
		var va driver.DevicePtr
		if err := check(t, "cuMemAddressReserve", t.MemAddressReserve(&va, size, m.gran, 0, 0)); err != nil {
			return err
		}
		defer t.MemAddressFree(va, size)
		for i := 0; i < b.N; i++ {
			var h driver.MemHandle
			var p driver.DevicePtr
			t0 := time.Now()
			r := t.MemCreate(&h, size, &m.prop, 0)
			t1 := time.Now()
			if err := check(t, "cuMemCreate", r); err != nil {
				return err
			}
			r = t.MemMap(va, size, 0, h, 0)
			t2 := time.Now()
			if err := check(t, "cuMemMap", r); err != nil {
				return err
			}
			r = t.MemSetAccess(va, size, &m.rw, 1)
			t3 := time.Now()
			if err := check(t, "cuMemSetAccess", r); err != nil {
				return err
			}
			r = t.MemUnmap(va, size)
			t4 := time.Now()
			if err := check(t, "cuMemUnmap", r); err != nil {
				return err
			}
			r = t.MemRelease(h)
			t5 := time.Now()
			if err := check(t, "cuMemRelease", r); err != nil {
				return err
			}
			r = t.MemAlloc(&p, size)
			t6 := time.Now()
			if err := check(t, "cuMemAlloc_v2", r); err != nil {
				return err
			}
			r = t.MemFree(p)
			t7 := time.Now()
			if err := check(t, "cuMemFree_v2", r); err != nil {
				return err
			}
			create += t1.Sub(t0)
			mapping += t2.Sub(t1)
			access += t3.Sub(t2)
			unmap += t4.Sub(t3)
			release += t5.Sub(t4)
			alloc += t6.Sub(t5)
			free += t7.Sub(t6)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(perOp(create, b.N), "create-us/chunk")
	b.ReportMetric(perOp(mapping, b.N), "map-us/chunk")
	b.ReportMetric(perOp(access, b.N), "setaccess-us/chunk")
	b.ReportMetric(perOp(unmap, b.N), "unmap-us/chunk")
	b.ReportMetric(perOp(release, b.N), "release-us/chunk")
	b.ReportMetric(perOp(alloc, b.N), "memalloc-us/chunk")
	b.ReportMetric(perOp(free, b.N), "memfree-us/chunk")
	if alloc > 0 {
		b.ReportMetric(float64(create+mapping+access)/float64(alloc), "install-x-vs-memalloc")
	}
}

// BenchmarkGrowth grows a buffer from one chunk to -cuda.grow-chunks chunks,
// alternately through VirtualBacking (Commit one chunk at a time; the address
// never moves, nothing is copied) and through cuMemAlloc-and-copy (allocate
// the bigger buffer, copy the old one with cuMemcpyDtoD, free it), and
// reports the alloc-and-copy time over the VMM time.
func BenchmarkGrowth(b *testing.B) {
	m := benchMech(b, Config{})
	g := memapi.Bytes(chunkBytes)
	if memapi.Bytes(m.gran) > g {
		g = memapi.Bytes(m.gran)
	}
	n := memapi.Bytes(*growChunks)
	gr := grantFor(m)
	s := stream(b, m)
	var vmm, alloccopy time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: n * g})
		if err != nil {
			b.Fatal(err)
		}
		for c := memapi.Bytes(0); c < n; c++ {
			if err := m.Commit(bg, res, memapi.Range{Off: c * g, Len: g}, gr); err != nil {
				b.Fatal(err)
			}
		}
		vmm += time.Since(t0)
		if err := m.ReleaseReservation(bg, res, gr); err != nil {
			b.Fatal(err)
		}

		t1 := time.Now()
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: g}, gr)
		if err != nil {
			b.Fatal(err)
		}
		for c := memapi.Bytes(2); c <= n; c++ {
			bigger, err := m.Allocate(bg, memapi.AllocRequest{Size: c * g}, gr)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.CopyDevice(bigger.Addr(), a.Addr(), (c-1)*g); err != nil {
				b.Fatal(err)
			}
			if err := s.Synchronize(bg); err != nil {
				b.Fatal(err)
			}
			if err := m.Free(bg, a, gr); err != nil {
				b.Fatal(err)
			}
			a = bigger
		}
		alloccopy += time.Since(t1)
		if err := m.Free(bg, a, gr); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(vmm.Microseconds())/float64(b.N), "vmm-us/grow")
	b.ReportMetric(float64(alloccopy.Microseconds())/float64(b.N), "alloccopy-us/grow")
	if vmm > 0 {
		b.ReportMetric(float64(alloccopy)/float64(vmm), "x-vs-alloccopy")
	}
}

// BenchmarkCommitChunk commits and decommits one chunk, alternately on a
// mechanism whose pool serves it and on one with no pool (cuMemCreate and
// cuMemRelease each time), and reports the no-pool time over the pool time.
func BenchmarkCommitChunk(b *testing.B) {
	pooled := benchMech(b, Config{PoolChunks: 1})
	bare := benchMech(b, Config{PoolChunks: -1})
	cycle := func(m *Mechanism, res *memapi.Reservation) time.Duration {
		r := memapi.Range{Len: memapi.Bytes(m.gran)}
		t0 := time.Now()
		if err := m.Commit(bg, res, r, grantFor(m)); err != nil {
			b.Fatal(err)
		}
		if err := m.Decommit(bg, res, r, grantFor(m)); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	reserve := func(m *Mechanism) *memapi.Reservation {
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: memapi.Bytes(m.gran)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.ReleaseReservation(bg, res, grantFor(m)) })
		return res
	}
	rp, rb := reserve(pooled), reserve(bare)
	var withPool, withoutPool time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		withPool += cycle(pooled, rp)
		withoutPool += cycle(bare, rb)
	}
	b.ReportMetric(perOp(withPool, b.N), "pool-us/cycle")
	b.ReportMetric(perOp(withoutPool, b.N), "nopool-us/cycle")
	if withPool > 0 {
		b.ReportMetric(float64(withoutPool)/float64(withPool), "x-vs-nopool")
	}
}

// BenchmarkGrowthStep grows a reservation one 2 MiB chunk per step, the way
// a KV cache grows, alternately on a mechanism with spares (the refiller maps
// the next chunk while the caller is elsewhere) and on one without (today's
// path: pool or cuMemCreate, cuMemMap, cuMemSetAccess and cuMemsetD8 on the
// caller's path, under the lock). The refiller's work between steps is not
// timed: it is off the caller's path. It reports, per step, the time of each
// side and, on the simulator, the driver calls on the caller's path, with
// their ratios (x-vs-today below 1: fewer, faster). On the simulator the
// figures are host-memory ones; gpu-check runs it on a GPU.
func BenchmarkGrowthStep(b *testing.B) {
	const steps = 16
	type side struct {
		m     *Mechanism
		sim   *cudasim.Sim
		res   *memapi.Reservation
		t     time.Duration
		calls int
	}
	var sides [2]*side
	for i, cfg := range []Config{{}, {SpareChunks: -1}} {
		m, sim := newMech(b, cudasim.Config{Memory: 16 << 30}, cfg)
		if !m.offers(memapi.CapVirtualBacking) {
			b.Skip("the device has no VMM")
		}
		sides[i] = &side{m: m, sim: sim}
	}
	g := memapi.Bytes(max(chunkBytes, sides[0].m.gran))
	calls := func(s *side) int {
		n := 0
		if s.sim != nil {
			for _, c := range vmmCalls {
				n += s.sim.Calls(c)
			}
		}
		return n
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, s := range sides {
			var err error
			if s.res, err = s.m.Reserve(bg, memapi.ReserveRequest{Size: steps * g}); err != nil {
				b.Fatal(err)
			}
		}
		for c := memapi.Bytes(0); c < steps; c++ {
			for _, s := range sides {
				s.m.quiesce()
				c0, t0 := calls(s), time.Now()
				if err := s.m.Commit(bg, s.res, memapi.Range{Off: c * g, Len: g}, grantFor(s.m)); err != nil {
					b.Fatal(err)
				}
				s.t += time.Since(t0)
				s.calls += calls(s) - c0
			}
		}
		for _, s := range sides {
			s.m.quiesce()
			if err := s.m.ReleaseReservation(bg, s.res, grantFor(s.m)); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := float64(b.N * steps)
	b.ReportMetric(float64(sides[0].t.Nanoseconds())/n/1e3, "spares-us/step")
	b.ReportMetric(float64(sides[1].t.Nanoseconds())/n/1e3, "today-us/step")
	b.ReportMetric(float64(sides[0].t)/float64(sides[1].t), "x-vs-today")
	if sides[0].sim != nil {
		b.ReportMetric(float64(sides[0].calls)/n, "spares-calls/step")
		b.ReportMetric(float64(sides[1].calls)/n, "today-calls/step")
		b.ReportMetric(float64(sides[0].calls)/float64(sides[1].calls), "calls-x-vs-today")
	}
}
