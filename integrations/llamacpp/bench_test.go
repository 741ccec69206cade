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
// of n_ctx 8,192, decodes 1,024 tokens in each (a 1,008-token prompt and 16
// greedy steps) and prints its resident set (and the set before the model
// was loaded), split by what maps it (rssParts), the Go runtime's account
// of its memory (goMemory), and on memgen's device the weights' bytes, the
// contexts' charged bytes (committed KV, compute and output buffers) and
// the KV's reserved bytes (all of n_ctx: what stock allocates). llama.cpp's log goes to standard error, where the parent
// reads the buffer sizes it reports. The contexts decode in batches of
// memoryBatch tokens computed in ubatches of memoryUBatch
// (LLAMACPP_MEMORY_BATCH and LLAMACPP_MEMORY_UBATCH override them).
func memChild(stock bool) int {
	fail := func(err error) int { fmt.Println("child:", err); return 3 }
	if err := Init(libPath); err != nil {
		return fail(err)
	}
	Verbose(true)
	heapStart := heapAddr()
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
	batch, ubatch := memoryBatch, memoryUBatch
	for _, e := range []struct {
		name string
		v    *int
	}{{"LLAMACPP_MEMORY_BATCH", &batch}, {"LLAMACPP_MEMORY_UBATCH", &ubatch}} {
		if v := os.Getenv(e.name); v != "" {
			if *e.v, err = strconv.Atoi(v); err != nil || *e.v <= 0 {
				return fail(fmt.Errorf("%s=%q: not a batch size", e.name, v))
			}
		}
	}
	var kv, reserved memapi.Bytes
	held := m.spans()
	for i := range 8 {
		c, err := m.NewContext(ctx, ContextOptions{NCtx: 8192, Batch: batch, UBatch: ubatch})
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
		// What the context's holder is charged: its committed KV and its
		// compute and output buffers.
		kv += c.KV().Committed + c.Compute()
		reserved += c.KV().Reserved
		held = append(held, c.spans()...)
	}
	rss, err := residentBytes()
	if err != nil {
		return fail(err)
	}
	parts, err := readRSSParts(held, []span{goHeapSpan(heapStart, heapAddr())})
	if err != nil {
		return fail(err)
	}
	g := readGoMemory()
	fmt.Printf("child: parts exe %d llamalibs %d syslibs %d held %d goheap %d stack %d other %d\n",
		parts.Exe, parts.LlamaLibs, parts.SysLibs, parts.Held, parts.GoHeap, parts.Stack, parts.Other)
	fmt.Printf("child: go live %d goal %d objects %d stacks %d metadata %d cycles %d\n",
		g.Live, g.Goal, g.Objects, g.Stacks, g.Metadata, g.Cycles)
	fmt.Printf("child: rss %d weights %d kv %d reserved %d base %d\n", rss, m.WeightBytes(), kv, reserved, base)
	return 0
}

// memoryBatch and memoryUBatch are the contexts' Batch and UBatch in
// BenchmarkMemory: a decode-heavy run's choice. llama.cpp's compute buffer
// (activations, outside memgen) is sized for UBatch tokens against all of
// n_ctx, and is what the parameters change most; Batch sets how many
// llama_decode calls (and growths) the prompt takes.
const (
	memoryBatch  = 32
	memoryUBatch = 8
)

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

// memSide is one child's figures in BenchmarkMemory.
type memSide struct {
	rss, weights, kv, reserved, base float64
	parts                            rssParts
	goMem                            goMemory
	bufs                             llamaBuffers
}

// BenchmarkMemory: 8 contexts x n_ctx 8,192 x 1,024 tokens each, in a
// child process for stock llama.cpp and one for memgen's device (so that
// each resident set is its own), both with the same context parameters
// (memoryBatch, memoryUBatch, one thread, flash attention, n_seq_max 1).
// Reports both resident sets, memgen's weights + committed KV, memgen's
// RSS over that (rss-over-held), and the resident set of the process
// before it loaded the model (base-rss-MiB: the Go runtime and the
// libraries). The same ratio for stock (stock-rss-over-held: its RSS over
// the same weights and its KV of all n_ctx), and each side's RSS beyond
// what it holds (memgen-outside-MiB, stock-outside-MiB) show how much of
// the resident set no KV allocator decides. It logs (and reports) each
// side's resident set split by what maps it (rssParts), the Go runtime's
// own account (goMemory) and the buffer sizes llama.cpp logs.
func BenchmarkMemory(b *testing.B) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	run := func(mode string) memSide {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+mode)
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("%s: %v\n%s", mode, err, lastLines(out, 20))
		}
		var s memSide
		got := 0
		for _, l := range strings.Split(string(out), "\n") {
			i := strings.Index(l, "child: ")
			if i < 0 {
				continue
			}
			l = l[i:]
			p, g := &s.parts, &s.goMem
			if _, err := fmt.Sscanf(l, "child: rss %g weights %g kv %g reserved %g base %g", &s.rss, &s.weights, &s.kv, &s.reserved, &s.base); err == nil {
				got++
			} else if _, err := fmt.Sscanf(l, "child: parts exe %d llamalibs %d syslibs %d held %d goheap %d stack %d other %d",
				&p.Exe, &p.LlamaLibs, &p.SysLibs, &p.Held, &p.GoHeap, &p.Stack, &p.Other); err == nil {
				got++
			} else if _, err := fmt.Sscanf(l, "child: go live %d goal %d objects %d stacks %d metadata %d cycles %d",
				&g.Live, &g.Goal, &g.Objects, &g.Stacks, &g.Metadata, &g.Cycles); err == nil {
				got++
			}
		}
		if got != 3 {
			b.Fatalf("%s: no figures in\n%s", mode, lastLines(out, 20))
		}
		s.bufs = parseLlamaBuffers(string(out))
		if s.bufs.Contexts != 8 {
			b.Fatalf("%s: llama.cpp logged the buffers of %d contexts, not 8", mode, s.bufs.Contexts)
		}
		return s
	}
	var stock, ours []memSide
	for range b.N {
		stock = append(stock, run("rss-stock"))
		ours = append(ours, run("rss-memgen"))
	}
	mean := func(sides []memSide, f func(memSide) float64) float64 {
		var t float64
		for _, s := range sides {
			t += f(s)
		}
		return t / float64(len(sides))
	}
	const mib = 1 << 20
	rss := mean(ours, func(s memSide) float64 { return s.rss })
	held := mean(ours, func(s memSide) float64 { return s.weights + s.kv })
	stockRSS := mean(stock, func(s memSide) float64 { return s.rss })
	// Stock holds the same weights and its KV of all n_ctx.
	stockHeld := mean(ours, func(s memSide) float64 { return s.weights + s.reserved })
	b.ReportMetric(stockRSS/mib, "stock-rss-MiB")
	b.ReportMetric(rss/mib, "memgen-rss-MiB")
	b.ReportMetric(held/mib, "memgen-held-MiB")
	b.ReportMetric(mean(ours, func(s memSide) float64 { return s.base })/mib, "base-rss-MiB")
	b.ReportMetric(rss/held, "rss-over-held")
	b.ReportMetric(rss/stockRSS, "x-vs-stock")
	b.ReportMetric(stockRSS/stockHeld, "stock-rss-over-held")
	b.ReportMetric((rss-held)/mib, "memgen-outside-MiB")
	b.ReportMetric((stockRSS-stockHeld)/mib, "stock-outside-MiB")
	goHeap := func(s memSide) float64 { return float64(s.parts.GoHeap) }
	other := func(s memSide) float64 { return float64(s.parts.Other) }
	b.ReportMetric(mean(ours, goHeap)/mib, "memgen-goheap-MiB")
	b.ReportMetric(mean(stock, goHeap)/mib, "stock-goheap-MiB")
	// Stock's weights and KV are in its other anonymous memory.
	b.ReportMetric((mean(stock, other)-stockHeld)/mib, "stock-other-anon-MiB")
	b.ReportMetric(mean(ours, other)/mib, "memgen-other-anon-MiB")
	b.ReportMetric(mean(ours, func(s memSide) float64 { return s.bufs.Compute })/8, "compute-buf-MiB/ctx")

	// The breakdown, one column per side (the last run's), on standard
	// output (the benchmark's log keeps only ten lines).
	o, s := ours[len(ours)-1], stock[len(stock)-1]
	var t strings.Builder
	row := func(what string, m, st float64) { fmt.Fprintf(&t, "  %-60s %9.2f %9.2f\n", what, m/mib, st/mib) }
	head := func(what string) { fmt.Fprintf(&t, "%-62s %9s %9s\n", what, "memgen", "stock") }
	head("BenchmarkMemory: resident set at the end (MiB)")
	row("VmRSS", o.rss, s.rss)
	row("  weights + KV: memgen's pmm ranges", float64(o.parts.Held), 0)
	row("  weights + KV: stock's, all of n_ctx (malloc)", 0, o.weights+o.reserved)
	row("  other anonymous: C heap (llama.cpp), thread stacks, Go off-heap", float64(o.parts.Other), float64(s.parts.Other)-(o.weights+o.reserved))
	row("  Go heap", float64(o.parts.GoHeap), float64(s.parts.GoHeap))
	row("  executable (the test binary)", float64(o.parts.Exe), float64(s.parts.Exe))
	row("  llama.cpp's libraries (libllama, libggml*)", float64(o.parts.LlamaLibs), float64(s.parts.LlamaLibs))
	row("  system libraries (libc, libstdc++, libm, ld.so)", float64(o.parts.SysLibs), float64(s.parts.SysLibs))
	row("  main thread's stack", float64(o.parts.Stack), float64(s.parts.Stack))
	row("  sum of the parts (read just after VmRSS)", float64(o.parts.total()), float64(s.parts.total()))
	row("process before the model (base)", o.base, s.base)
	row("held: memgen weights, committed KV, compute buffers; stock weights + all KV", o.weights+o.kv, o.weights+o.reserved)
	row("RSS beyond what is held", o.rss-o.weights-o.kv, s.rss-o.weights-o.reserved)
	head("Go runtime (runtime/metrics, MiB)")
	gm := func(what string, f func(goMemory) uint64) { row(what, float64(f(o.goMem)), float64(f(s.goMem))) }
	gm("heap live (at the last GC)", func(g goMemory) uint64 { return g.Live })
	gm("heap goal", func(g goMemory) uint64 { return g.Goal })
	gm("heap objects (live and not yet swept)", func(g goMemory) uint64 { return g.Objects })
	gm("goroutine stacks", func(g goMemory) uint64 { return g.Stacks })
	gm("GC and allocator metadata", func(g goMemory) uint64 { return g.Metadata })
	fmt.Fprintf(&t, "  %-60s %9d %9d\n", "GC cycles", o.goMem.Cycles, s.goMem.Cycles)
	head("llama.cpp's logged buffers, all contexts (MiB)")
	lb := func(what string, f func(llamaBuffers) float64) {
		fmt.Fprintf(&t, "  %-60s %9.2f %9.2f\n", what, f(o.bufs), f(s.bufs))
	}
	lb("model buffer (weights)", func(l llamaBuffers) float64 { return l.Model })
	lb("KV buffers (memgen's: reserved, not committed)", func(l llamaBuffers) float64 { return l.KV })
	lb("compute buffers", func(l llamaBuffers) float64 { return l.Compute })
	lb("output buffers", func(l llamaBuffers) float64 { return l.Output })
	fmt.Print(t.String())
}

// lastLines is the last n lines of out.
func lastLines(out []byte, n int) string {
	ls := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}
