package llamacpp

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The scenario TestLedgerMatchesProcess runs: 4 contexts of n_ctx 4,096,
// 1,024 tokens decoded in each (a 1,008-token prompt and 16 greedy steps),
// with the default batch and ubatch (512).
const (
	ledgerContexts = 4
	ledgerNCtx     = 4096
	ledgerPrompt   = 1008
	ledgerSteps    = 16
)

// ledgerFigures is what the scenario's child process reports.
type ledgerFigures struct {
	Base, Peak, RSS             int64 // VmRSS before the model, VmHWM since then, VmRSS at the end
	Charged                     int64 // the authority's charged bytes at the end
	Weights, KV, Compute        int64 // what the model and the contexts hold of it
	Before, After               rssParts
	CBefore, CAfter             CHeap
	GoBefore, GoAfter           goMemory
	ThreadsBefore, ThreadsAfter int64
	Steps                       []ledgerStep // the growth beyond the ledger after each step
}

type ledgerStep struct {
	Name    string
	Outside int64
}

// Outside the ledger, llama.cpp keeps per context what no buffer type
// allocates: two graphs' metadata (std::vector, zero-filled: about 420 KiB
// each for 1,024 nodes), the scheduler's tables, the KV cells' metadata
// (position, shift and sequence set: 48 bytes per cell) and the batch
// allocator's per-token vectors; and the process faults in the libraries'
// code as it first runs it. ledgerPerContext and ledgerFixed bound these,
// as measured (about 1.7 MiB per context and 2.5 MiB; the test logs each
// step's share).
const (
	ledgerPerContext = 2 << 20
	ledgerFixed      = 4 << 20
)

// TestLedgerMatchesProcess: the governor's ledger accounts for what the
// process's resident set grows by. In a child process of its own, after
// llama.cpp's libraries are loaded and before the model is, the resident
// set is taken as the baseline (and its peak reset); then the model is
// loaded on memgen's device and 4 contexts of n_ctx 4,096 decode 1,024
// tokens each. memgen's ranges are resident for exactly the authority's
// charged bytes (weights, committed KV, the contexts' compute and output
// buffers), and the peak resident set grows beyond them by no more than
// llama.cpp's own bookkeeping (ledgerFixed + ledgerPerContext per
// context). The remainder is itemised from the process's own maps (smaps
// and mincore), glibc's malloc figures, the Go runtime's and the growth
// after each step; the test also reports it against the aim of 5 % of the
// charged bytes or 8 MiB, whichever is larger. Under the race detector
// (whose shadow memory grows with the process's) only the exact part is
// checked.
func TestLedgerMatchesProcess(t *testing.T) {
	f := runLedgerChild(t)
	growth := f.Peak - f.Base
	outside := growth - f.Charged
	aim := max(f.Charged/20, 8<<20)
	bound := int64(ledgerFixed + ledgerContexts*ledgerPerContext)
	mib := func(n int64) string { return fmt.Sprintf("%8.2f MiB", float64(n)/(1<<20)) }
	d := func(get func(rssParts) int64) int64 { return get(f.After) - get(f.Before) }
	cHeap := f.CAfter.FromSystem - f.CBefore.FromSystem
	var b strings.Builder
	fmt.Fprintf(&b, "%d contexts x n_ctx %d, %d tokens each:\n", ledgerContexts, ledgerNCtx, ledgerPrompt+ledgerSteps)
	fmt.Fprintf(&b, "  peak RSS growth                          %s (VmHWM %s - baseline %s)\n", mib(growth), mib(f.Peak), mib(f.Base))
	fmt.Fprintf(&b, "  charged in the ledger                    %s (weights %s, KV %s, compute and output buffers %s)\n",
		mib(f.Charged), mib(f.Weights), mib(f.KV), mib(f.Compute))
	fmt.Fprintf(&b, "  outside the ledger                       %s (%.1f %% of the charged bytes; bound %s; aim of 5 %% or 8 MiB: %s, %s)\n",
		mib(outside), 100*float64(outside)/float64(f.Charged), mib(bound), mib(aim), map[bool]string{true: "met", false: "missed"}[outside <= aim])
	fmt.Fprintf(&b, "where the resident set grew (end - baseline):\n")
	fmt.Fprintf(&b, "  memgen's ranges (resident, by mincore)   %s\n", mib(d(func(p rssParts) int64 { return p.Held })))
	fmt.Fprintf(&b, "  other anonymous memory                   %s: the C heap (glibc holds %s more, in use %s -> %s, mostly untouched),\n",
		mib(d(func(p rssParts) int64 { return p.Other })), mib(cHeap), mib(f.CBefore.InUse), mib(f.CAfter.InUse))
	fmt.Fprintf(&b, "                                           thread stacks (%d -> %d threads), the Go runtime's off-heap memory\n", f.ThreadsBefore, f.ThreadsAfter)
	fmt.Fprintf(&b, "  Go heap                                  %s (objects %s -> %s)\n",
		mib(d(func(p rssParts) int64 { return p.GoHeap })), mib(int64(f.GoBefore.Objects)), mib(int64(f.GoAfter.Objects)))
	fmt.Fprintf(&b, "  llama.cpp's libraries (pages first run)  %s\n", mib(d(func(p rssParts) int64 { return p.LlamaLibs })))
	fmt.Fprintf(&b, "  system libraries                         %s\n", mib(d(func(p rssParts) int64 { return p.SysLibs })))
	fmt.Fprintf(&b, "  the executable                           %s\n", mib(d(func(p rssParts) int64 { return p.Exe })))
	fmt.Fprintf(&b, "  main thread's stack                      %s\n", mib(d(func(p rssParts) int64 { return p.Stack })))
	fmt.Fprintf(&b, "  transient: the peak above the end        %s\n", mib(max(0, f.Peak-f.RSS)))
	fmt.Fprintf(&b, "outside the ledger, step by step (what each step added):\n")
	prev := int64(0)
	for _, s := range f.Steps {
		fmt.Fprintf(&b, "  %-8s %s\n", s.Name, mib(s.Outside-prev))
		prev = s.Outside
	}
	t.Log("\n" + b.String())
	if f.Weights <= 0 || f.KV <= 0 || f.Compute <= 0 || f.Weights+f.KV+f.Compute != f.Charged {
		t.Errorf("the ledger's charged bytes (%d) are not the weights (%d), KV (%d) and compute buffers (%d)", f.Charged, f.Weights, f.KV, f.Compute)
	}
	if held := d(func(p rssParts) int64 { return p.Held }); held != f.Charged {
		t.Errorf("memgen's ranges grew the resident set by %d bytes, the ledger charges %d", held, f.Charged)
	}
	if outside > bound && !raceEnabled {
		t.Errorf("the resident set grew %d bytes beyond the ledger's %d: more than llama.cpp's bookkeeping (%d)", outside, f.Charged, bound)
	}
}

// runLedgerChild runs the scenario in a child process and reads its
// figures.
func runLedgerChild(t *testing.T) ledgerFigures {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=ledger")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, lastLines(out, 20))
	}
	var f ledgerFigures
	got := 0
	for _, l := range strings.Split(string(out), "\n") {
		if n, err := fmt.Sscanf(l, "ledger: base %d peak %d rss %d charged %d weights %d kv %d compute %d",
			&f.Base, &f.Peak, &f.RSS, &f.Charged, &f.Weights, &f.KV, &f.Compute); err == nil && n == 7 {
			got++
		}
		var st ledgerStep
		if n, err := fmt.Sscanf(l, "ledger: step %s outside %d", &st.Name, &st.Outside); err == nil && n == 2 {
			f.Steps = append(f.Steps, st)
		}
		for _, side := range []struct {
			name string
			p    *rssParts
			c    *CHeap
			g    *goMemory
			th   *int64
		}{{"before", &f.Before, &f.CBefore, &f.GoBefore, &f.ThreadsBefore}, {"after", &f.After, &f.CAfter, &f.GoAfter, &f.ThreadsAfter}} {
			p, c, g := side.p, side.c, side.g
			if n, err := fmt.Sscanf(l, "ledger: "+side.name+" exe %d llamalibs %d syslibs %d held %d goheap %d stack %d other %d cheap %d %d goobjects %d threads %d",
				&p.Exe, &p.LlamaLibs, &p.SysLibs, &p.Held, &p.GoHeap, &p.Stack, &p.Other, &c.InUse, &c.FromSystem, &g.Objects, side.th); err == nil && n == 11 {
				got++
			}
		}
	}
	if got != 3 || len(f.Steps) != 1+2*ledgerContexts {
		t.Fatalf("child: no figures in\n%s", lastLines(out, 20))
	}
	return f
}

// ledgerChild is the scenario's child process.
func ledgerChild() int {
	fail := func(err error) int { fmt.Println("child:", err); return 3 }
	if err := Init(libPath); err != nil {
		return fail(err)
	}
	heapStart := heapAddr()
	report := func(side string, held []span) error {
		parts, err := readRSSParts(held, []span{goHeapSpan(heapStart, heapAddr())})
		if err != nil {
			return err
		}
		c, g := ReadCHeap(), readGoMemory()
		threads, err := statusField("Threads:")
		if err != nil {
			return err
		}
		fmt.Printf("ledger: %s exe %d llamalibs %d syslibs %d held %d goheap %d stack %d other %d cheap %d %d goobjects %d threads %d\n",
			side, parts.Exe, parts.LlamaLibs, parts.SysLibs, parts.Held, parts.GoHeap, parts.Stack, parts.Other, c.InUse, c.FromSystem, g.Objects, threads)
		return nil
	}
	if err := report("before", nil); err != nil {
		return fail(err)
	}
	// The baseline: llama.cpp's libraries are loaded, the model is not.
	// Writing 5 to clear_refs resets the peak resident set (VmHWM).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fail(err)
	}
	base, err := residentBytes()
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, _, err := newChildRig()
	if err != nil {
		return fail(err)
	}
	// outside prints the resident set's growth beyond the ledger after a
	// step of the scenario (what the step added is its llama.cpp
	// bookkeeping, Go's and the libraries' pages).
	outside := func(step string) error {
		rss, err := residentBytes()
		if err != nil {
			return err
		}
		s, _ := r.g.Authority(hostAuth)
		fmt.Printf("ledger: step %s outside %d\n", step, rss-base-int64(s.Charged))
		return nil
	}
	m, err := LoadModel(ctx, modelPath, r.options())
	if err != nil {
		return fail(err)
	}
	if err := outside("load"); err != nil {
		return fail(err)
	}
	held := m.spans()
	var kv, compute int64
	for i := range ledgerContexts {
		c, err := m.NewContext(ctx, ContextOptions{NCtx: ledgerNCtx})
		if err != nil {
			return fail(err)
		}
		if err := outside(fmt.Sprintf("create%d", i)); err != nil {
			return fail(err)
		}
		next, err := c.Decode(ctx, prompt(i, ledgerPrompt, m.NVocab()))
		for range ledgerSteps {
			if err != nil {
				return fail(err)
			}
			next, err = c.Decode(ctx, []int32{next})
		}
		if err != nil {
			return fail(err)
		}
		if err := outside(fmt.Sprintf("decode%d", i)); err != nil {
			return fail(err)
		}
		kv += int64(c.KV().Committed)
		compute += int64(c.Compute())
		held = append(held, c.spans()...)
	}
	peak, err := statusField("VmHWM:")
	if err != nil {
		return fail(err)
	}
	rss, err := residentBytes()
	if err != nil {
		return fail(err)
	}
	s, _ := r.g.Authority(hostAuth)
	if err := report("after", held); err != nil {
		return fail(err)
	}
	fmt.Printf("ledger: base %d peak %d rss %d charged %d weights %d kv %d compute %d\n",
		base, peak, rss, s.Charged, m.WeightBytes(), kv, compute)
	return 0
}

// statusField reads a field of /proc/self/status: a size in kB (returned
// in bytes) or a count.
func statusField(name string) (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), name); ok {
			rest = strings.TrimSpace(rest)
			kb, isKB := strings.CutSuffix(rest, " kB")
			n, err := strconv.ParseInt(kb, 10, 64)
			if isKB {
				n <<= 10
			}
			return n, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", name)
}
