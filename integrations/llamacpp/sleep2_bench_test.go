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

// freshPages maps n bytes of anonymous memory and populates them as the
// CPU mechanism commits at granularity gran (MADV_POPULATE_WRITE, huge
// pages advised at 2 MiB granules): a wake's pages without memgen. It
// returns them and the time the populate took (not the mapping's).
func freshPages(b *testing.B, n, gran memapi.Bytes) ([]byte, time.Duration) {
	b.Helper()
	p, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	if gran%(2<<20) == 0 {
		_ = syscall.Madvise(p, syscall.MADV_HUGEPAGE)
	}
	if err := syscall.Madvise(p, madvPopulateWrite); err != nil {
		b.Fatal(err)
	}
	return p, time.Since(start)
}

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

					p, pop := freshPages(b, total, g.gran)
					start = time.Now().Add(-pop) // the fresh row counts the populate, not the mapping
					freshPop = append(freshPop, pop)
					readAll(p)
					fresh = append(fresh, time.Since(start))
					if err := syscall.Munmap(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			med, ms := medianDuration, millis
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

// BenchmarkLevel1Wake times a level-1 wake of the same 302 MiB model as
// BenchmarkLevel2Wake (the weights' bytes copied back from the host tier
// into their regions, committed again at the same addresses) against
// copying the same number of bytes with Go's copy (a memmove) from one
// buffer into another whose pages are already faulted in. The fresh row
// copies into newly mapped anonymous memory populated first
// (MADV_POPULATE_WRITE, as the CPU mechanism commits): the kernel's share
// of a wake, its page faults and zeroing, without memgen. The staged row
// is the wake of the weights moved with pmm.Region.Offload, whose copies go
// through pmm.Transfer's staging buffer (the path of a host tier that is
// not a CPU mechanism's). Five rounds of each, interleaved; the medians
// and the ratio are reported, at the CPU mechanism's 2 MiB granularity
// (huge pages) and at 4 KiB.
//
//	go test -run '^$' -bench BenchmarkLevel1Wake -benchtime 1x .
func BenchmarkLevel1Wake(b *testing.B) {
	path := wakeModel(b)
	for _, g := range []struct {
		name string
		gran memapi.Bytes
	}{{"2MiB", cpu.Granularity2MiB}, {"4KiB", cpu.Granularity4KiB}} {
		b.Run(g.name, func(b *testing.B) {
			r := newRigGranule(b, 4<<30, g.gran)
			tier := r.hostTier(b)
			m := loadModelAt(b, path, r.options())
			weights := m.WeightBytes()
			if weights < 256<<20 {
				b.Fatalf("the model has %d bytes of weights, want at least 256 MiB", weights)
			}
			if err := m.Sleep(bg(b), tier.bind); err != nil {
				b.Fatal(err)
			}
			if err := m.Wake(bg(b)); err != nil {
				b.Fatal(err)
			}
			src := make([]byte, weights) // the host copy's stand-in
			dst := make([]byte, weights) // faulted in: the warm destination
			for i := range src {
				src[i], dst[i] = byte(i), 1
			}

			const rounds = 5
			var wake, commit, cp, staged, base, fresh, freshPop []time.Duration
			for range b.N {
				for range rounds {
					stagedMoves = true
					err := m.Sleep(bg(b), tier.bind)
					stagedMoves = false
					if err != nil {
						b.Fatal(err)
					}
					exactTiers(b, r, tier)
					start := time.Now()
					if err := m.Wake(bg(b)); err != nil {
						b.Fatal(err)
					}
					staged = append(staged, time.Since(start))
					exactTiers(b, r, tier)

					if err := m.Sleep(bg(b), tier.bind); err != nil {
						b.Fatal(err)
					}
					exactTiers(b, r, tier)
					if st := m.SleepState(); st.Moved != weights {
						b.Fatalf("asleep with %d bytes of weights in the host tier, want %d", st.Moved, weights)
					}
					c0, p0 := m.wakeCommit1, m.wakeCopy1
					start = time.Now()
					if err := m.Wake(bg(b)); err != nil {
						b.Fatal(err)
					}
					wake = append(wake, time.Since(start))
					commit = append(commit, m.wakeCommit1-c0)
					cp = append(cp, m.wakeCopy1-p0)
					exactTiers(b, r, tier)

					start = time.Now()
					copy(dst, src)
					base = append(base, time.Since(start))

					p, pop := freshPages(b, weights, g.gran)
					start = time.Now().Add(-pop) // the fresh row counts the populate, not the mapping
					freshPop = append(freshPop, pop)
					copy(p, src)
					fresh = append(fresh, time.Since(start))
					if err := syscall.Munmap(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			med, ms := medianDuration, millis
			ratio := float64(med(wake)) / float64(med(base))
			b.ReportMetric(ms(med(wake)), "wake-ms")
			b.ReportMetric(ms(med(base)), "memcpy-ms")
			b.ReportMetric(ratio, "wake/memcpy")
			gbs := func(d time.Duration) float64 { return float64(weights) / d.Seconds() / 1e9 }
			b.Logf("%s granules, %.0f MiB of weights, median of %d rounds:", g.name, float64(weights)/(1<<20), len(wake))
			b.Logf("  level-1 wake             %7.1f ms (%5.2f GB/s): commit %.1f ms, copy %.1f ms", ms(med(wake)), gbs(med(wake)), ms(med(commit)), ms(med(cp)))
			b.Logf("  staged (pmm.Offload)     %7.1f ms (%5.2f GB/s)", ms(med(staged)), gbs(med(staged)))
			b.Logf("  copy -> faulted buffer   %7.1f ms (%5.2f GB/s)", ms(med(base)), gbs(med(base)))
			b.Logf("  copy -> fresh pages      %7.1f ms (%5.2f GB/s): populate %.1f ms", ms(med(fresh)), gbs(med(fresh)), ms(med(freshPop)))
			b.Logf("  wake / memcpy = %.2fx; wake / fresh pages = %.2fx; staged / memcpy = %.2fx", ratio, float64(med(wake))/float64(med(fresh)), float64(med(staged))/float64(med(base)))
			b.Logf("  rounds: wake %v, staged %v, memcpy %v, fresh %v", wake, staged, base, fresh)
			fmt.Printf("level1-wake %s: wake=%.1fms staged=%.1fms memcpy=%.1fms fresh=%.1fms ratio=%.2fx\n", g.name, ms(med(wake)), ms(med(staged)), ms(med(base)), ms(med(fresh)), ratio)
		})
	}
}

// medianDuration is the median of ds (the upper middle one for an even
// count); ds is left as it was.
func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
