package gen

import (
	"os"
	"testing"
	"time"
)

// BenchmarkGenerate measures what `memgen generate` spends before it touches
// the disk: loading and validating the real spec, then running every emitter
// (jennifer rendering and gofmt included). Each iteration times both halves,
// so the split (load-ns/op, emit-ns/op) and the ratio of a whole run to the
// spec front end (x-vs-load) come from the same iterations, however noisy
// the machine.
func BenchmarkGenerate(b *testing.B) {
	data, err := os.ReadFile(realSpec)
	if err != nil {
		b.Fatal(err)
	}
	cfg := Config{Module: realModule, Root: ".."}
	var load, emit time.Duration
	files, n := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		t0 := time.Now()
		s, err := Load(specName, data)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		out, err := Generate(s, cfg)
		if err != nil {
			b.Fatal(err)
		}
		emit += time.Since(t1)
		load += t1.Sub(t0)
		files = len(out)
		n++
	}
	b.ReportMetric(float64(files), "files")
	b.ReportMetric(float64(load.Nanoseconds())/float64(n), "load-ns/op")
	b.ReportMetric(float64(emit.Nanoseconds())/float64(n), "emit-ns/op")
	b.ReportMetric(float64((load+emit).Nanoseconds())/float64(load.Nanoseconds()), "x-vs-load")
}

// BenchmarkLoad is the spec front end alone: parse, load and validate.
func BenchmarkLoad(b *testing.B) {
	data, err := os.ReadFile(realSpec)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Load(specName, data); err != nil {
			b.Fatal(err)
		}
	}
}
