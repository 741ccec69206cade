package plugin

import (
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// BenchmarkABIOverhead measures a call through the plugin ABI (the loader,
// purego and the reference C plugin) against the same call on the native Go
// CPU mechanism, alternating the two in one loop, and reports the ratio
// (x-vs-cpu) beside each side's time per call. UsedBytes is the bare cost of
// a slot call; CommittedBytes adds a handle lookup and an out parameter on
// both sides; AllocateFree is a real 4 KiB mmap and munmap per pair, where
// the kernel's work dominates.
func BenchmarkABIOverhead(b *testing.B) {
	pm, err := New(refhost(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer pm.Close()
	cm, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB})
	if err != nil {
		b.Fatal(err)
	}
	pres, err := pm.Reserve(bg, memapi.ReserveRequest{Size: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer pm.ReleaseReservation(bg, pres, nil)
	cres, err := cm.Reserve(bg, memapi.ReserveRequest{Size: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer cm.ReleaseReservation(bg, cres, nil)
	const batch = 64
	for _, c := range []struct {
		name        string
		plugin, cpu func(b *testing.B)
	}{
		{"UsedBytes", func(*testing.B) { pm.UsedBytes() }, func(*testing.B) { cm.UsedBytes() }},
		{"CommittedBytes",
			func(b *testing.B) {
				if _, err := pm.CommittedBytes(pres); err != nil {
					b.Fatal(err)
				}
			},
			func(b *testing.B) {
				if _, err := cm.CommittedBytes(cres); err != nil {
					b.Fatal(err)
				}
			}},
		{"AllocateFree", allocFree(pm), allocFree(cm)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var tp, tc time.Duration
			for b.Loop() {
				t0 := time.Now()
				for range batch {
					c.plugin(b)
				}
				t1 := time.Now()
				for range batch {
					c.cpu(b)
				}
				tc += time.Since(t1)
				tp += t1.Sub(t0)
			}
			calls := float64(b.N * batch)
			b.ReportMetric(float64(tp.Nanoseconds())/calls, "plugin-ns/call")
			b.ReportMetric(float64(tc.Nanoseconds())/calls, "cpu-ns/call")
			b.ReportMetric(float64(tp)/float64(tc), "x-vs-cpu")
		})
	}
}

func allocFree(m memapi.Mechanism) func(b *testing.B) {
	return func(b *testing.B) {
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Free(bg, a, nil); err != nil {
			b.Fatal(err)
		}
	}
}
