package llamacpp

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/integrations/llamacpp/gguf"
	"github.com/memgen/memgen/mechanisms/cpu"
)

// wakeShape is the model BenchmarkLevel2Wake reloads: TinyShape's kind at
// 1,024 wide, 6 layers and a feed-forward of 2,816, F32: 302 MiB of
// weights.
var wakeShape = gguf.Shape{Embd: 1024, Layers: 6, Heads: 16, HeadsKV: 16, FF: 2816, Vocab: 1024, CtxTrain: 4096}

// wakeModel writes the benchmark's model into the cache once (a temporary
// directory when the cache cannot be written) and returns its path.
func wakeModel(b *testing.B) string {
	b.Helper()
	name := "wake-llama-f32-1024x6-seed1.gguf"
	for _, dir := range []string{cacheDir(), b.TempDir()} {
		path := filepath.Join(dir, name)
		if _, err := gguf.Check(path); err == nil {
			return path
		}
		kvs, ts := gguf.Tiny(wakeShape, 1)
		tmp := path + ".tmp"
		if err := gguf.WriteFile(tmp, kvs, ts); err != nil {
			b.Logf("writing %s: %v", tmp, err)
			os.Remove(tmp)
			continue
		}
		if err := os.Rename(tmp, path); err != nil {
			b.Fatal(err)
		}
		return path
	}
	b.Fatal("the benchmark's model could not be written")
	return ""
}

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14).
const madvPopulateWrite = 23

// BenchmarkLevel2Wake times a level-2 wake of a 302 MiB model (each
// weight region committed again, then every tensor read from the model
// file into it) against reading the same file ranges from the page cache
// into memory that is already faulted in (one buffer of the weights' size,
// touched before): the same ReadAt loop. The fresh row reads them into
// newly mapped anonymous memory populated first (MADV_POPULATE_WRITE, as
// the CPU mechanism commits), which is the kernel's share of a wake
// without memgen. Five rounds of each, interleaved; the medians and the
// ratio are reported, at the CPU mechanism's 2 MiB granularity (huge
// pages) and at 4 KiB.
//
//	go test -run '^$' -bench BenchmarkLevel2Wake -benchtime 1x .
func BenchmarkLevel2Wake(b *testing.B) {
	path := wakeModel(b)
	for _, g := range []struct {
		name string
		gran memapi.Bytes
	}{{"2MiB", cpu.Granularity2MiB}, {"4KiB", cpu.Granularity4KiB}} {
		b.Run(g.name, func(b *testing.B) {
			r := newRigGranule(b, 4<<30, g.gran)
			m := loadModelAt(b, path, r.options())
			weights := m.WeightBytes()
			if weights < 256<<20 {
				b.Fatalf("the model has %d bytes of weights, want at least 256 MiB", weights)
			}
			// A first sleep compares the weights with the file (once) and
			// plans the reads.
			if err := m.SleepLevel(bg(b), 2, nil); err != nil {
				b.Fatal(err)
			}
			if err := m.Wake(bg(b)); err != nil {
				b.Fatal(err)
			}
			type rng struct {
				file int64
				n    memapi.Bytes
			}
			var runs []rng
			var total memapi.Bytes
			for _, w := range m.bufs {
				if w.differs != "" {
					b.Fatalf("tensor %s is not the file's", w.differs)
				}
				for _, r := range w.runs {
					runs = append(runs, rng{r.file, r.n})
					total += r.n
				}
			}
			f, err := os.Open(path)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			readAll := func(buf []byte) {
				var at memapi.Bytes
				for _, r := range runs {
					if _, err := f.ReadAt(buf[at:at+r.n], r.file); err != nil {
						b.Fatal(err)
					}
					at += r.n
				}
			}
			warm := make([]byte, total)
			for i := range warm {
				warm[i] = 1
			}
			readAll(warm)

			const rounds = 5
			var wake, commit, read, base, fresh, freshPop []time.Duration
			for range b.N {
				for range rounds {
					if err := m.SleepLevel(bg(b), 2, nil); err != nil {
						b.Fatal(err)
					}
					r.settle(b)
					c0, r0 := m.wakeCommit, m.wakeRead
					start := time.Now()
					if err := m.Wake(bg(b)); err != nil {
						b.Fatal(err)
					}
					wake = append(wake, time.Since(start))
					commit = append(commit, m.wakeCommit-c0)
					read = append(read, m.wakeRead-r0)

					start = time.Now()
					readAll(warm)
					base = append(base, time.Since(start))

					p, err := syscall.Mmap(-1, 0, int(total), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
					if err != nil {
						b.Fatal(err)
					}
					start = time.Now()
					if g.gran%(2<<20) == 0 {
						_ = syscall.Madvise(p, syscall.MADV_HUGEPAGE)
					}
					if err := syscall.Madvise(p, madvPopulateWrite); err != nil {
						b.Fatal(err)
					}
					freshPop = append(freshPop, time.Since(start))
					readAll(p)
					fresh = append(fresh, time.Since(start))
					if err := syscall.Munmap(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			med := func(ds []time.Duration) time.Duration {
				s := slices.Clone(ds)
				slices.Sort(s)
				return s[len(s)/2]
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			ratio := float64(med(wake)) / float64(med(base))
			b.ReportMetric(ms(med(wake)), "wake-ms")
			b.ReportMetric(ms(med(base)), "pagecache-ms")
			b.ReportMetric(ratio, "wake/pagecache")
			mib := float64(total) / (1 << 20)
			b.Logf("%s granules, %.0f MiB of weights in %d reads, median of %d rounds:", g.name, mib, len(runs), len(wake))
			b.Logf("  level-2 wake                 %7.1f ms (%5.2f GB/s): commit %.1f ms, reads %.1f ms", ms(med(wake)), float64(total)/med(wake).Seconds()/1e9, ms(med(commit)), ms(med(read)))
			b.Logf("  page cache -> faulted buffer %7.1f ms (%5.2f GB/s)", ms(med(base)), float64(total)/med(base).Seconds()/1e9)
			b.Logf("  page cache -> fresh pages    %7.1f ms (%5.2f GB/s): populate %.1f ms", ms(med(fresh)), float64(total)/med(fresh).Seconds()/1e9, ms(med(freshPop)))
			b.Logf("  wake / page cache = %.2fx; wake / fresh pages = %.2fx", ratio, float64(med(wake))/float64(med(fresh)))
			b.Logf("  rounds: wake %v, page cache %v, fresh %v", wake, base, fresh)
			fmt.Printf("level2-wake %s: wake=%.1fms pagecache=%.1fms ratio=%.2fx\n", g.name, ms(med(wake)), ms(med(base)), ratio)
		})
	}
}
