package llamacpp

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// BenchmarkDecode: one context on stock llama.cpp and one on memgen's
// device, one thread each, a 16-token prompt then 1,024 greedy
// single-token steps, the two engines alternating step by step (which
// goes first alternates too), so that a shared machine's load falls on
// both alike; fresh contexts of n_ctx 2,048 every iteration. The steps
// are timed in blocks of decodeBlock tokens: x-vs-stock is the median,
// over the blocks, of memgen's block time over stock's (each ratio taken
// over the same stretch of the machine's load, the median keeping a burst
// of load on one side of a block from deciding the figure), and
// x-vs-stock-mean is the plain ratio of the totals. A block holds the
// same share of growth as the whole run (blockTokens), so the median
// hides none of it. Reports tokens
// per second of both, and the time memgen spent growing the regions per
// token (grow-ns/token, inside memgen's time).
func BenchmarkDecode(b *testing.B) {
	const steps = 1024
	stock := loadModel(b, Options{Stock: true, Threads: 1})
	r := newRig(b, 1<<30)
	ours := loadModel(b, Options{Manager: r.mgr, Governor: r.g, Device: r.host, Threads: 1})
	type side struct {
		c     *Context
		next  int32
		out   []int32
		took  time.Duration
		block time.Duration
	}
	open := func(m *Model) *side {
		c, err := m.NewContext(bg(b), ContextOptions{NCtx: 2048})
		if err != nil {
			b.Fatal(err)
		}
		next, err := c.Decode(bg(b), prompt(5, 16, m.NVocab()))
		if err != nil {
			b.Fatal(err)
		}
		return &side{c: c, next: next, out: make([]int32, 0, steps)}
	}
	step := func(s *side) {
		s.out = append(s.out, s.next)
		start := time.Now()
		next, err := s.c.Decode(bg(b), []int32{s.next})
		d := time.Since(start)
		s.took += d
		s.block += d
		if err != nil {
			b.Fatal(err)
		}
		s.next = next
	}
	var tStock, tOurs, grow time.Duration
	var ratios []float64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		a, o := open(stock), open(ours)
		block := blockTokens(o.c)
		before := o.c.Stats()
		b.StartTimer()
		for i := range steps {
			if i%2 == 0 {
				step(a)
				step(o)
			} else {
				step(o)
				step(a)
			}
			if (i+1)%block == 0 {
				ratios = append(ratios, float64(o.block)/float64(a.block))
				a.block, o.block = 0, 0
			}
		}
		b.StopTimer()
		if hashTokens(a.out) != hashTokens(o.out) {
			b.Fatalf("tokens differ: stock %x, memgen %x", hashTokens(a.out), hashTokens(o.out))
		}
		tStock += a.took
		tOurs += o.took
		grow += o.c.Stats().GrowTime - before.GrowTime
		for _, s := range []*side{a, o} {
			if err := s.c.Close(bg(b)); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	tokens := float64(b.N * steps)
	b.ReportMetric(tokens/tStock.Seconds(), "stock-tok/s")
	b.ReportMetric(tokens/tOurs.Seconds(), "memgen-tok/s")
	b.ReportMetric(medianOf(ratios), "x-vs-stock")
	b.ReportMetric(tOurs.Seconds()/tStock.Seconds(), "x-vs-stock-mean")
	b.ReportMetric(float64(grow.Nanoseconds())/tokens, "grow-ns/token")
	b.ReportMetric(100*grow.Seconds()/tOurs.Seconds(), "grow-%")
}

// blockTokens is the tokens of one timed block of BenchmarkDecode: at
// least 16, and a whole number of the rows one granule of a KV tensor
// holds (the tiny model: 4 rows of 1 KiB in 4 KiB), so that every block
// holds the same number of growths.
func blockTokens(c *Context) int {
	kv := c.KV()
	per := int(c.Granularity() / (kv.RowBytes / memapi.Bytes(kv.Tensors)))
	if per <= 1 {
		return 16
	}
	return (16 + per - 1) / per * per
}

// medianOf returns the median of x (0 for none); x is sorted in place.
func medianOf(x []float64) float64 {
	n := len(x)
	if n == 0 {
		return 0
	}
	sort.Float64s(x)
	if n%2 == 1 {
		return x[n/2]
	}
	return (x[n/2-1] + x[n/2]) / 2
}

// memChild loads the model (stock or on memgen's device), opens 8 contexts
// of n_ctx 8,192 and batches of 32 (or LLAMACPP_MEMORY_BATCH; llama.cpp's
// compute buffer, outside memgen, grows with n_ctx x batch), decodes 1,024 tokens in each (a
// 1,008-token prompt and 16 greedy steps), and prints its resident set
// (and the set before the model was loaded) and, on memgen's device, the
// weights' bytes, the committed KV's and the KV's reserved bytes (all of
// n_ctx: what stock allocates).
func memChild(stock bool) int {
	fail := func(err error) int { fmt.Println("child:", err); return 3 }
	if err := Init(libPath); err != nil {
		return fail(err)
	}
	base, err := residentBytes()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts := Options{Stock: true}
	if !stock {
		r, _, err := newChildRig()
		if err != nil {
			return fail(err)
		}
		opts = r.options()
	}
	m, err := LoadModel(ctx, modelPath, opts)
	if err != nil {
		return fail(err)
	}
	batch := 32
	if v := os.Getenv("LLAMACPP_MEMORY_BATCH"); v != "" {
		if batch, err = strconv.Atoi(v); err != nil || batch <= 0 {
			return fail(fmt.Errorf("LLAMACPP_MEMORY_BATCH=%q: not a batch size", v))
		}
	}
	var kv, reserved memapi.Bytes
	for i := range 8 {
		c, err := m.NewContext(ctx, ContextOptions{NCtx: 8192, Batch: batch})
		if err != nil {
			return fail(err)
		}
		next, err := c.Decode(ctx, prompt(i, 1008, m.NVocab()))
		for range 16 {
			if err != nil {
				return fail(err)
			}
			next, err = c.Decode(ctx, []int32{next})
		}
		if err != nil {
			return fail(err)
		}
		kv += c.KV().Committed
		reserved += c.KV().Reserved
	}
	rss, err := residentBytes()
	if err != nil {
		return fail(err)
	}
	fmt.Printf("child: rss %d weights %d kv %d reserved %d base %d\n", rss, m.WeightBytes(), kv, reserved, base)
	return 0
}

// residentBytes reads VmRSS from /proc/self/status.
func residentBytes() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/self/status")
}

// BenchmarkMemory: 8 contexts x n_ctx 8,192 x 1,024 tokens each, in a
// child process for stock llama.cpp and one for memgen's device (so that
// each resident set is its own). Reports both resident sets, memgen's
// weights + committed KV, memgen's RSS over that (rss-over-held), and the
// resident set of the process before it loaded the model (base-rss-MiB:
// the Go runtime and the libraries). The same ratio for stock
// (stock-rss-over-held: its RSS over the same weights and its KV of all
// n_ctx), and each side's RSS beyond what it holds (memgen-outside-MiB,
// stock-outside-MiB: the process base, llama.cpp's per-context scheduler,
// graph and compute buffers, and on memgen's side its Go bookkeeping)
// show how much of the resident set no KV allocator decides.
func BenchmarkMemory(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	run := func(mode string) (rss, weights, kv, reserved, base float64) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("%s: %v\n%s", mode, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if _, err := fmt.Sscanf(l, "child: rss %g weights %g kv %g reserved %g base %g", &rss, &weights, &kv, &reserved, &base); err == nil {
				return rss, weights, kv, reserved, base
			}
		}
		b.Fatalf("%s: no figures in\n%s", mode, out)
		return
	}
	var stockRSS, rss, held, stockHeld, base float64
	for range b.N {
		s, _, _, _, _ := run("rss-stock")
		o, w, k, r, b0 := run("rss-memgen")
		stockRSS += s
		rss += o
		held += w + k
		stockHeld += w + r
		base += b0
	}
	n := float64(b.N)
	b.ReportMetric(stockRSS/n/(1<<20), "stock-rss-MiB")
	b.ReportMetric(rss/n/(1<<20), "memgen-rss-MiB")
	b.ReportMetric(held/n/(1<<20), "memgen-held-MiB")
	b.ReportMetric(base/n/(1<<20), "base-rss-MiB")
	b.ReportMetric(rss/held, "rss-over-held")
	b.ReportMetric(rss/stockRSS, "x-vs-stock")
	b.ReportMetric(stockRSS/stockHeld, "stock-rss-over-held")
	b.ReportMetric((rss-held)/n/(1<<20), "memgen-outside-MiB")
	b.ReportMetric((stockRSS-stockHeld)/n/(1<<20), "stock-outside-MiB")
}
