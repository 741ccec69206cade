package ort

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// The decoder model scripts/ort.sh builds (decoder 4 256 4 2 4096 1024
// 1024): 4 layers, 2 KV heads of size 64, 4,096 rows, vocabulary 1,024.
var decoderModel = envOr("MEMGEN_ORT_DECODER_MODEL", cacheDir()+"/gqa-decoder-l4d256h4kv2s4096v1024.onnx")

const (
	decMaxSeq   = 4096
	decTensors  = 4 * 2 * 2 // layers × KV heads × {key, value}
	decRowBytes = 64 * 4
	kvGranule   = cpu.Granularity4KiB
)

func needDecoder(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(decoderModel); err != nil {
		t.Fatalf("%v: run `make ort` to build it", err)
	}
}

// kvHost is a governed host device for KV caches: the CPU mechanism with
// 4 KiB granules (16 cache rows of 256 bytes), holder "kv" (which frees
// nothing under pressure: a sequence's cache is data) bound to it.
type kvHost struct {
	g    *governor.Governor
	m    *cpu.Mechanism
	ectx *ep.Context
	mgr  *pmm.Manager
	bind *pmm.Binding
}

func newKVHost(t testing.TB, capacity memapi.Bytes) *kvHost {
	t.Helper()
	g := governor.New(governor.Options{})
	if err := g.AddAuthority(hostAuth, capacity); err != nil {
		t.Fatal(err)
	}
	m, err := cpu.New(cpu.Options{Granularity: kvGranule, Authority: hostAuth})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: ectx, Authority: hostAuth}); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("kv", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	bind, err := mgr.Bind("kv", "kv-cache", host)
	if err != nil {
		t.Fatal(err)
	}
	h := &kvHost{g: g, m: m, ectx: ectx, mgr: mgr, bind: bind}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ectx.Close(ctx, true); err != nil {
			t.Error(err)
		}
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return h
}

// charged drains the release queue and returns the authority's charge,
// failing the test unless the ledger is balanced with nothing pending or
// reserved and the mechanism's count and the kernel's (mincore) equal it.
func (h *kvHost) charged(t testing.TB, what string) memapi.Bytes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.ectx.Queue().Drain(ctx); err != nil {
		t.Fatalf("%s: drain: %v", what, err)
	}
	s, _ := h.g.Authority(hostAuth)
	used := h.m.UsedBytes()
	kern, err := h.m.KernelBytes()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Balanced() || s.Pending != 0 || s.Reserved != 0 || s.Charged != used || used != kern {
		t.Fatalf("%s: ledger charged %d pending %d reserved %d (balanced %v), mechanism %d, kernel %d",
			what, s.Charged, s.Pending, s.Reserved, s.Balanced(), used, kern)
	}
	return s.Charged
}

// kvBytes is what a KVGrow sequence of tokens tokens holds: per cache
// tensor the rows times the row bytes, rounded up to the granule.
func kvBytes(tokens int) memapi.Bytes {
	per, _ := memapi.RoundUp(memapi.Bytes(tokens)*decRowBytes, kvGranule)
	return per * decTensors
}

func newDecoder(t testing.TB, bind *pmm.Binding, mode KVMode) *Decoder {
	t.Helper()
	needDecoder(t)
	d, err := NewDecoder(decoderModel, bind, DecoderOptions{Mode: mode, MaxSeq: decMaxSeq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

func argmax(x []float32) int64 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int64(best)
}

// sampler picks each step's next token by Gumbel-max sampling with a fixed
// seed: argmax(logits + g) with g_i = -log(-log(u_i)), the same g for every
// sequence at a step. Greedy decoding of random weights falls into a short
// cycle of tokens at once; sampling keeps the tokens varied, and sequences
// whose logits agree draw the same token.
type sampler struct {
	r     *rand.Rand
	noise []float64
}

func newSampler(vocab int) *sampler {
	return &sampler{r: rand.New(rand.NewPCG(26, 2048)), noise: make([]float64, vocab)}
}

// next draws the step's noise.
func (s *sampler) next() {
	for i := range s.noise {
		u := s.r.Float64()
		for u == 0 {
			u = s.r.Float64()
		}
		s.noise[i] = -math.Log(-math.Log(u))
	}
}

// pick is the token of logits under the step's noise.
func (s *sampler) pick(logits []float32) int64 {
	best, bv := 0, math.Inf(-1)
	for i, l := range logits {
		if v := float64(l) + s.noise[i]; v > bv {
			best, bv = i, v
		}
	}
	return int64(best)
}

func maxDiff(a, b []float32) float64 {
	var m float64
	for i := range a {
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

func newSequence(t testing.TB, d *Decoder) *Sequence {
	t.Helper()
	q, err := d.NewSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := q.Close(); err != nil {
			t.Error(err)
		}
	})
	return q
}

// TestDecoderGrowMatchesConcat decodes 2,048 tokens with the same sampled
// token stream three ways, in lockstep: KVGrow (share buffer over Regions
// grown per token), KVPreallocated (share buffer over Buffers of 4,096
// rows) and KVConcat (past/present, ONNX Runtime allocating and copying the
// whole cache every step). After every step:
//   - the tokens are equal, and the largest logit difference is logged;
//   - bound once: every cache tensor of the share-buffer sequences is the
//     same OrtValue as past and as present, its data is its memory's
//     address, and neither changed since NewSequence; the package made no
//     OrtValue (the process-wide count), while the concat sequence's pasts
//     are new tensors of ONNX Runtime's every step;
//   - accounting: the KVGrow host's ledger, the mechanism's count and
//     mincore all equal rows × 256 bytes rounded up to the 4 KiB granule,
//     times the 16 cache tensors; the preallocated host's equal the 16
//     Buffers of 1 MiB.
//
// After Close both hosts are at 0.
func TestDecoderGrowMatchesConcat(t *testing.T) {
	const steps = 2048
	hg := newKVHost(t, 64<<20)
	hp := newKVHost(t, 64<<20)
	grow := newDecoder(t, hg.bind, KVGrow)
	pre := newDecoder(t, hp.bind, KVPreallocated)
	cat := newDecoder(t, nil, KVConcat)
	if grow.Tensors() != decTensors || grow.RowBytes() != decRowBytes || grow.Vocab() != 1024 {
		t.Fatalf("decoder: %d cache tensors of %d-byte rows, vocabulary %d; want %d, %d, 1024", grow.Tensors(), grow.RowBytes(), grow.Vocab(), decTensors, decRowBytes)
	}
	sg, sp, sc := newSequence(t, grow), newSequence(t, pre), newSequence(t, cat)
	preBytes := memapi.Bytes(decTensors * decMaxSeq * decRowBytes)
	if n := hg.charged(t, "grow: new sequence"); n != 0 {
		t.Fatalf("a new KVGrow sequence is charged %d bytes, want 0 (addresses only)", n)
	}
	if n := hp.charged(t, "preallocated: new sequence"); n != preBytes {
		t.Fatalf("a new KVPreallocated sequence is charged %d bytes, want %d", n, preBytes)
	}
	bg0, err := sg.bindings()
	if err != nil {
		t.Fatal(err)
	}
	bp0, err := sp.bindings()
	if err != nil {
		t.Fatal(err)
	}
	for _, bs := range [][]binding{bg0, bp0} {
		seen := map[uintptr]bool{}
		for i, b := range bs {
			if b.past == 0 || b.past != b.present || b.data != uintptr(b.mem) || b.mem == 0 || seen[b.data] {
				t.Fatalf("cache tensor %d: past %#x, present %#x, data %#x, memory %#x: want one value over its own memory", i, b.past, b.present, b.data, b.mem)
			}
			seen[b.data] = true
		}
	}
	const made = 4 + decTensors // input_ids, seqlens_k, total_sequence_length, logits, the cache
	for _, q := range []*Sequence{sg, sp, sc} {
		if n := q.Stats().TensorsMade; n != made {
			t.Fatalf("%v sequence made %d tensors, want %d", q.d.Mode(), n, made)
		}
	}
	// The concat sequence's binding before the step: its past is a new
	// tensor every step (the last step's present, alive while this step's
	// present is made, so never at the same address; an older one may be).
	bcPrev, err := sc.bindings()
	if err != nil {
		t.Fatal(err)
	}
	values := valuesMade()

	ctx := context.Background()
	smp := newSampler(grow.Vocab())
	tg, tp, tc := int64(1), int64(1), int64(1)
	var diffGrow, diffPre float64
	for i := range steps {
		lg, err := sg.Step(ctx, tg)
		if err != nil {
			t.Fatalf("step %d: grow: %v", i, err)
		}
		lp, err := sp.Step(ctx, tp)
		if err != nil {
			t.Fatalf("step %d: preallocated: %v", i, err)
		}
		lc, err := sc.Step(ctx, tc)
		if err != nil {
			t.Fatalf("step %d: concat: %v", i, err)
		}
		diffGrow, diffPre = max(diffGrow, maxDiff(lg, lc)), max(diffPre, maxDiff(lp, lc))
		smp.next()
		tg, tp, tc = smp.pick(lg), smp.pick(lp), smp.pick(lc)
		if tg != tc || tp != tc {
			t.Fatalf("step %d: next token %d (grow), %d (preallocated), %d (concat)", i, tg, tp, tc)
		}

		for k, bs := range [][]binding{bg0, bp0} {
			q := []*Sequence{sg, sp}[k]
			now, err := q.bindings()
			if err != nil {
				t.Fatal(err)
			}
			for j := range bs {
				if now[j] != bs[j] {
					t.Fatalf("step %d: %v cache tensor %d is bound as %+v, was %+v", i, q.d.Mode(), j, now[j], bs[j])
				}
			}
		}
		if now, err := sc.bindings(); err != nil {
			t.Fatal(err)
		} else if now[0].past == bcPrev[0].past || now[0].data == bcPrev[0].data {
			t.Fatalf("step %d: the concat sequence's past is the tensor of the step before: the check above would not see a rebinding", i)
		} else {
			bcPrev = now
		}
		if n := valuesMade(); n != values {
			t.Fatalf("step %d: %d OrtValues made during the steps, want 0", i, n-values)
		}

		want := kvBytes(i + 1)
		if n, b := hg.charged(t, fmt.Sprintf("grow: step %d", i)), sg.Stats().Backed; n != want || b != want {
			t.Fatalf("step %d (%d tokens): grow host charged %d, sequence backed %d; want %d (%d tokens × %d bytes per tensor rounded up to %d, × %d)",
				i, i+1, n, b, want, i+1, decRowBytes, kvGranule, decTensors)
		}
		if n := hp.charged(t, fmt.Sprintf("preallocated: step %d", i)); n != preBytes {
			t.Fatalf("step %d: preallocated host charged %d, want %d", i, n, preBytes)
		}
	}
	stg, stp, stc := sg.Stats(), sp.Stats(), sc.Stats()
	if stg.RuntimeTensors != 0 || stp.RuntimeTensors != 0 || stc.RuntimeTensors != steps*decTensors {
		t.Fatalf("present tensors ONNX Runtime made: grow %d, preallocated %d, concat %d; want 0, 0, %d", stg.RuntimeTensors, stp.RuntimeTensors, stc.RuntimeTensors, steps*decTensors)
	}
	if stg.Tokens != steps || stp.Tokens != steps || stc.Tokens != steps {
		t.Fatalf("tokens %d, %d, %d; want %d", stg.Tokens, stp.Tokens, stc.Tokens, steps)
	}
	t.Logf("%d steps, the same %d tokens: max |logit difference| grow vs concat %.3g, preallocated vs concat %.3g", steps, steps, diffGrow, diffPre)
	t.Logf("cache at the end: grow %d bytes backed, preallocated %d (ratio %.3f); concat made %d present tensors of %.0f MiB in all",
		stg.Backed, stp.Backed, float64(stg.Backed)/float64(stp.Backed), stc.RuntimeTensors, float64(stc.PresentBytes)/(1<<20))

	for _, q := range []*Sequence{sg, sp, sc} {
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := hg.charged(t, "grow: closed"); n != 0 {
		t.Fatalf("grow host charged %d after Close", n)
	}
	if n := hp.charged(t, "preallocated: closed"); n != 0 {
		t.Fatalf("preallocated host charged %d after Close", n)
	}
}

// TestDecoderReadsTheCache shows the steps read the rows the Regions back:
// two KVGrow sequences fed the same 40 tokens agree on the next step's
// logits, until one's cached keys and values are overwritten with zeros,
// after which the same token gives other logits.
func TestDecoderReadsTheCache(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	a, b := newSequence(t, d), newSequence(t, d)
	ctx := context.Background()
	step := func(q *Sequence, tok int64) []float32 {
		t.Helper()
		l, err := q.Step(ctx, tok)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(l)
	}
	for i := range 40 {
		tok := int64(i * 37 % d.Vocab())
		if la, lb := step(a, tok), step(b, tok); maxDiff(la, lb) != 0 {
			t.Fatalf("step %d: the same tokens gave other logits", i)
		}
	}
	bs, err := b.bindings()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range bs {
		zeroAt(x.data, 40*decRowBytes)
	}
	if la, lb := step(a, 7), step(b, 7); maxDiff(la, lb) == 0 {
		t.Fatal("zeroing one sequence's cached rows did not change its logits: the steps do not read the cache")
	}
}

// TestDecoderOneRowShortFaults shows that ONNX Runtime touches only the
// rows a step needs, and really does touch the last: a child process steps
// a KVGrow sequence 16 tokens (one 4 KiB granule of 16 rows per tensor),
// then runs the 17th with its Regions grown one row short of it (still one
// granule: row 16 unbacked, PROT_NONE). It dies of SIGSEGV in that Run. The
// same child with nothing short grows a second granule and survives.
func TestDecoderOneRowShortFaults(t *testing.T) {
	if mode := os.Getenv("MEMGEN_ORT_KV_CHILD"); mode != "" {
		oneRowShortChild(t, mode == "short")
		return
	}
	needDecoder(t)
	run := func(mode string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestDecoderOneRowShortFaults$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "MEMGEN_ORT_KV_CHILD="+mode)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("exact")
	if err != nil || !strings.Contains(out, "kv-child: survived") {
		t.Fatalf("the child with every row backed failed (%v):\n%s", err, out)
	}
	out, err = run("short")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(out, "SIGSEGV") ||
		!strings.Contains(out, "kv-child: stepping token 17 with 16 rows backed") || strings.Contains(out, "kv-child: survived") {
		t.Fatalf("the child one row short did not die of SIGSEGV in the step (%v):\n%s", err, out)
	}
	i := strings.Index(out, "SIGSEGV")
	t.Logf("one row short: the child exited with status 2: %s", strings.SplitN(out[i:], "\n", 2)[0])
}

func oneRowShortChild(t *testing.T, short bool) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q := newSequence(t, d)
	ctx := context.Background()
	for i := range 16 {
		if _, err := q.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.charged(t, "16 tokens"); n != kvBytes(16) || kvBytes(16) != decTensors*kvGranule {
		t.Fatalf("16 tokens: charged %d, want one granule per tensor (%d)", n, decTensors*kvGranule)
	}
	if short {
		q.short = 1
	}
	fmt.Fprintf(os.Stderr, "kv-child: stepping token 17 with %d rows backed\n", 17-q.short)
	if _, err := q.Step(ctx, 16); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(os.Stderr, "kv-child: survived")
}

// TestDecoderCloseDuringStep closes a KVGrow sequence while its step is
// about to run (from the step's own hook, after the run's fence was
// recorded): Close returns at once, the Regions stay backed, charged and
// pending until the Run has returned, the Run completes on them, and then
// they are released and refunded. The next Step is memapi.ErrClosed.
func TestDecoderCloseDuringStep(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q := newSequence(t, d)
	ctx := context.Background()
	for i := range 40 {
		if _, err := q.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	held := h.charged(t, "40 tokens")
	if held != kvBytes(40) {
		t.Fatalf("40 tokens: charged %d, want %d", held, kvBytes(40))
	}
	ran := false
	q.beforeRun = func() error {
		ran = true
		if err := q.Close(); err != nil {
			return err
		}
		s, _ := h.g.Authority(hostAuth)
		kern, err := h.m.KernelBytes()
		if err != nil {
			return err
		}
		for i, r := range q.region {
			if st := r.State(); st != ep.Pending {
				return fmt.Errorf("region %d is %v after Close with a run about to start, want pending behind its fence", i, st)
			}
		}
		if s.Pending != held || s.Charged != 0 || h.m.UsedBytes() != held || kern != held {
			return fmt.Errorf("after Close, before the run: ledger charged %d pending %d, mechanism %d, kernel %d; want the %d bytes pending and still backed",
				s.Charged, s.Pending, h.m.UsedBytes(), kern, held)
		}
		return nil
	}
	if _, err := q.Step(ctx, 40); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("the hook did not run")
	}
	if n := h.charged(t, "closed during the step"); n != 0 {
		t.Fatalf("charged %d after the step closed during returned", n)
	}
	if _, err := q.Step(ctx, 1); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("Step after Close: %v, want ErrClosed", err)
	}
}

// TestDecoderOverBudget refuses a step's growth: the budget holds 32
// tokens' cache and 5 granules more, so the 33rd token's growth (16
// granules) fails at the 6th Region. Step returns a *GrowError for which
// errors.Is(err, memapi.ErrOverBudget), within the caller's deadline; the 5
// Regions grown for it are shrunk back, so the ledger, the mechanism and
// mincore are at 32 tokens' cache again. With the budget raised the same
// step runs, with the logits of a sequence that was never refused.
func TestDecoderOverBudget(t *testing.T) {
	h := newKVHost(t, kvBytes(32)+5*kvGranule)
	d := newDecoder(t, h.bind, KVGrow)
	ref := newDecoder(t, nil, KVConcat)
	q, r := newSequence(t, d), newSequence(t, ref)
	ctx := context.Background()
	for i := range 32 {
		if _, err := q.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	const deadline = 250 * time.Millisecond
	sctx, cancel := context.WithTimeout(ctx, deadline)
	t0 := time.Now()
	_, err := q.Step(sctx, 32)
	took := time.Since(t0)
	cancel()
	var ge *GrowError
	if !errors.As(err, &ge) || !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("the 33rd token over budget: %v, want a *GrowError over budget", err)
	}
	t.Logf("refused in %v (deadline %v): %v", took, deadline, err)
	if ge.Tokens != 33 || ge.Held != kvBytes(32) {
		t.Fatalf("GrowError tokens %d held %d, want 33 and %d", ge.Tokens, ge.Held, kvBytes(32))
	}
	if n, st := h.charged(t, "refused"), q.Stats(); n != kvBytes(32) || st.Backed != n || st.Tokens != 32 {
		t.Fatalf("after the refusal: charged %d, sequence backed %d with %d tokens; want %d and 32", n, st.Backed, st.Tokens, kvBytes(32))
	}
	if err := h.g.SetCapacity(hostAuth, kvBytes(64)); err != nil {
		t.Fatal(err)
	}
	lq, err := q.Step(ctx, 32)
	if err != nil {
		t.Fatal(err)
	}
	lr, err := r.Step(ctx, 32)
	if err != nil {
		t.Fatal(err)
	}
	if dd := maxDiff(lq, lr); dd != 0 {
		t.Fatalf("the step after a refusal: logits differ from the reference by %g", dd)
	}
	if n := h.charged(t, "grown"); n != kvBytes(33) {
		t.Fatalf("33 tokens: charged %d, want %d", n, kvBytes(33))
	}
}

// TestDecoderFleet runs KVGrow sequences under one budget of 3 MiB (three
// sequences of 256 tokens) to 320 tokens each: 4 at a time, 8 in all,
// each round stepping every live sequence in its own goroutine (one
// session, concurrent Runs). A step whose growth the governor refuses
// must fail with a *GrowError within its 100 ms deadline (over budget, or
// out of time waiting for another sequence's growth), leaving nothing of
// its own charged; the scheduler then preempts the youngest refused
// sequence (closes it), starts the next, and the others step again. After every round the ledger,
// the mechanism and mincore equal the live sequences' rows rounded up per
// tensor, never above the budget; after the last, 0.
func TestDecoderFleet(t *testing.T) {
	const (
		target   = 320
		atOnce   = 4
		total    = 8
		deadline = 100 * time.Millisecond
	)
	capacity := 3 * kvBytes(256)
	h := newKVHost(t, capacity)
	d := newDecoder(t, h.bind, KVGrow)
	ctx := context.Background()
	type member struct {
		q   *Sequence
		id  int
		tok int64
		err error
		dt  time.Duration
	}
	var live []*member
	started, finished, preempted, refusals, overBudget := 0, 0, 0, 0, 0
	t.Cleanup(func() {
		for _, m := range live {
			_ = m.q.Close()
		}
	})
	refill := func() {
		for len(live) < atOnce && started < total {
			q, err := d.NewSequence(ctx)
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, &member{q: q, id: started, tok: int64(started)})
			started++
		}
	}
	audit := func(what string) {
		t.Helper()
		var want memapi.Bytes
		for _, m := range live {
			want += kvBytes(m.q.Tokens())
		}
		if n := h.charged(t, what); n != want || n > capacity {
			t.Fatalf("%s: charged %d, want %d (the live sequences' rows), capacity %d", what, n, want, capacity)
		}
	}
	refill()
	for round := 0; len(live) > 0; round++ {
		if round > 4*total*target {
			t.Fatal("the fleet did not finish")
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // figures read while the sequences step
			defer wg.Done()
			for _, m := range live {
				_ = m.q.Stats()
				_ = m.q.Tokens()
			}
		}()
		for _, m := range live {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				t0 := time.Now()
				l, err := m.q.Step(sctx, m.tok)
				m.dt, m.err = time.Since(t0), err
				if err == nil {
					m.tok = (argmax(l) + int64(m.id)) % int64(d.Vocab())
				}
			}()
		}
		wg.Wait()
		// The youngest refused sequence is preempted (closed); the others
		// refused keep their cache and step again next round.
		victim := -1
		for _, m := range live {
			if m.err == nil {
				continue
			}
			var ge *GrowError
			if !errors.As(m.err, &ge) || !(errors.Is(m.err, memapi.ErrOverBudget) || errors.Is(m.err, context.DeadlineExceeded)) {
				t.Fatalf("round %d: sequence %d: %v, want a *GrowError over budget or out of time for its turn", round, m.id, m.err)
			}
			if ge.Held != kvBytes(m.q.Tokens()) {
				t.Fatalf("round %d: sequence %d refused holding %d, want %d", round, m.id, ge.Held, kvBytes(m.q.Tokens()))
			}
			refusals++
			if errors.Is(m.err, memapi.ErrOverBudget) {
				overBudget++
			}
			victim = max(victim, m.id)
		}
		keep := live[:0]
		for _, m := range live {
			switch {
			case m.id == victim:
				t.Logf("round %d: sequence %d refused at %d tokens in %v; preempted", round, m.id, m.q.Tokens()+1, m.dt.Round(time.Millisecond))
				if err := m.q.Close(); err != nil {
					t.Fatal(err)
				}
				preempted++
			case m.q.Tokens() == target:
				if err := m.q.Close(); err != nil {
					t.Fatal(err)
				}
				finished++
			default:
				keep = append(keep, m)
			}
		}
		live = keep
		audit(fmt.Sprintf("round %d", round))
		refill()
	}
	t.Logf("%d sequences: %d reached %d tokens, %d preempted; %d refusals, %d of them over budget", started, finished, target, preempted, refusals, overBudget)
	if overBudget == 0 || finished == 0 || preempted == 0 || started != total {
		t.Fatalf("%d started, %d finished, %d refusals: the budget did not bind", started, finished, refusals)
	}
	if n := h.charged(t, "fleet done"); n != 0 {
		t.Fatalf("charged %d after every sequence closed", n)
	}
}

// TestDecoderBadInput: what the Decoder and a Sequence refuse, each a
// typed error that changes nothing.
func TestDecoderBadInput(t *testing.T) {
	h := newKVHost(t, 64<<20)
	needDecoder(t)
	if _, err := NewDecoder(decoderModel, nil, DecoderOptions{Mode: KVGrow, MaxSeq: 16}); !errors.Is(err, memapi.ErrNilHandle) {
		t.Errorf("KVGrow without a binding: %v, want ErrNilHandle", err)
	}
	if _, err := NewDecoder(decoderModel, h.bind, DecoderOptions{Mode: KVGrow}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("MaxSeq 0: %v, want ErrInvalidSize", err)
	}
	if _, err := NewDecoder(decoderModel, h.bind, DecoderOptions{Mode: KVMode(9), MaxSeq: 16}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("an unknown mode: %v, want ErrUnsupported", err)
	}
	if _, err := NewDecoder(smallModel, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 16}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("an MLP as a decoder: %v, want ErrUnsupported", err)
	} else {
		t.Log(err)
	}
	d, err := NewDecoder(decoderModel, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 16})
	if err != nil {
		t.Fatal(err)
	}
	q, err := d.NewSequence(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tok := range []int64{-1, int64(d.Vocab())} {
		if _, err := q.Step(ctx, tok); !errors.Is(err, memapi.ErrInvalidRange) {
			t.Errorf("token %d: %v, want ErrInvalidRange", tok, err)
		}
	}
	if n, st := h.charged(t, "bad tokens"), q.Stats(); n != 0 || st.Tokens != 0 {
		t.Errorf("after refused tokens: charged %d, %d tokens", n, st.Tokens)
	}
	for i := range 16 {
		if _, err := q.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Step(ctx, 1); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("a 17th token with MaxSeq 16: %v, want ErrInvalidRange", err)
	}
	if n := h.charged(t, "full"); n != kvBytes(16) {
		t.Errorf("full: charged %d, want %d", n, kvBytes(16))
	}
	// The preallocated share buffer is full at MaxSeq too (there no Region
	// bounds the growth: ONNX Runtime would be asked for a 17th row).
	dp, err := NewDecoder(decoderModel, h.bind, DecoderOptions{Mode: KVPreallocated, MaxSeq: 16})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := dp.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if _, err := qp.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := qp.Step(ctx, 1); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("a 17th token with MaxSeq 16, preallocated: %v, want ErrInvalidRange", err)
	}
	if err := errors.Join(qp.Close(), dp.Close()); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("Decoder.Close with a sequence open: %v, want ErrInUse", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if _, err := q.Step(ctx, 1); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("Step after Close: %v, want ErrClosed", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NewSequence(ctx); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("NewSequence after Close: %v, want ErrClosed", err)
	}
	if n := h.charged(t, "closed"); n != 0 {
		t.Errorf("charged %d after Close", n)
	}
}

// TestDecoderConcurrentStepRefused: a Step while another runs on the same
// sequence is memapi.ErrInUse, and changes nothing.
func TestDecoderConcurrentStepRefused(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q := newSequence(t, d)
	ctx := context.Background()
	var inner error
	q.beforeRun = func() error {
		q.beforeRun = nil
		_, inner = q.Step(ctx, 2)
		return nil
	}
	if _, err := q.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, memapi.ErrInUse) {
		t.Fatalf("a Step during a Step: %v, want ErrInUse", inner)
	}
	if st := q.Stats(); st.Tokens != 1 {
		t.Fatalf("%d tokens, want 1", st.Tokens)
	}
}

// TestDecoderGrowsOneSequenceAtATime: two sequences at 16 tokens step at
// once with room for one growth (16 granules). A, having grown its first
// Region, waits up to 200 ms for B to grow one too: were growths
// interleaved, both would hold part of the room and wait for the rest,
// and both be refused. In the decoder's grow turn B waits for A's whole
// growth: A's step runs, B's is refused (over budget, within its 1 s
// deadline), and the ledger holds A's 17 tokens and B's 16.
func TestDecoderGrowsOneSequenceAtATime(t *testing.T) {
	h := newKVHost(t, 2*kvBytes(16)+16*kvGranule)
	d := newDecoder(t, h.bind, KVGrow)
	a, b := newSequence(t, d), newSequence(t, d)
	ctx := context.Background()
	for i := range 16 {
		for _, q := range []*Sequence{a, b} {
			if _, err := q.Step(ctx, int64(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	bGrew := make(chan struct{})
	var once sync.Once
	a.afterGrow = func(i int) {
		if i == 0 {
			select {
			case <-bGrew:
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	b.afterGrow = func(int) { once.Do(func() { close(bGrew) }) }
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for k, q := range []*Sequence{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if k == 1 {
				time.Sleep(20 * time.Millisecond) // A first
			}
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, errs[k] = q.Step(sctx, 16)
		}()
	}
	wg.Wait()
	var ge *GrowError
	if errs[0] != nil || !errors.As(errs[1], &ge) {
		t.Fatalf("A: %v; B: %v; want A's step to run and B's to be refused", errs[0], errs[1])
	}
	if n := h.charged(t, "one grew"); n != kvBytes(17)+kvBytes(16) {
		t.Fatalf("charged %d, want %d", n, kvBytes(17)+kvBytes(16))
	}
}

// TestDecoderNewSequenceOverBudget: a preallocated sequence whose 16
// Buffers of 1 MiB do not fit a 4 MiB budget is refused over budget within
// its deadline, and the Buffers it had made are released: nothing stays
// charged, and the decoder closes (no sequence counted live).
func TestDecoderNewSequenceOverBudget(t *testing.T) {
	h := newKVHost(t, 4<<20)
	needDecoder(t)
	d, err := NewDecoder(decoderModel, h.bind, DecoderOptions{Mode: KVPreallocated, MaxSeq: decMaxSeq})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := d.NewSequence(ctx); !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("16 MiB of buffers under a 4 MiB budget: %v, want over budget", err)
	}
	if n := h.charged(t, "refused"); n != 0 {
		t.Fatalf("charged %d after the refused sequence", n)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDecoderCloseWaitsForTheStep: a sequence closed while its Step is
// about to run keeps the decoder's session in use until the Step returns:
// Decoder.Close meanwhile is memapi.ErrInUse (it used to free the session
// under the running Run: SIGSEGV), and succeeds once the Step returned.
func TestDecoderCloseWaitsForTheStep(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q := newSequence(t, d)
	var during error
	q.beforeRun = func() error {
		q.beforeRun = nil
		if err := q.Close(); err != nil {
			return err
		}
		during = d.Close()
		return nil
	}
	if _, err := q.Step(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(during, memapi.ErrInUse) {
		t.Fatalf("Decoder.Close while a closed sequence's Step runs: %v, want ErrInUse", during)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Decoder.Close once the Step returned: %v", err)
	}
	if n := h.charged(t, "closed"); n != 0 {
		t.Fatalf("charged %d after both closed", n)
	}
}

// TestDecoderFailedStepGivesTheGrowthBack: a step that fails after its
// growth (here before its Run; a failed Run takes the same path) gives the
// growth back at once: the ledger holds the tokens the sequence had, not
// the failed step's rows until Close.
func TestDecoderFailedStepGivesTheGrowthBack(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q := newSequence(t, d)
	ctx := context.Background()
	// 48 tokens fill their granules exactly: the 49th step grows every
	// Region by one.
	full := int(kvGranule / decRowBytes * 3)
	for i := range full {
		if _, err := q.Step(ctx, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := h.charged(t, "48 tokens")
	boom := errors.New("the run failed")
	grew := false
	q.beforeRun = func() error {
		grew = q.backed[0] > memapi.Bytes(full)*decRowBytes
		return boom
	}
	if _, err := q.Step(ctx, int64(full)); !errors.Is(err, boom) {
		t.Fatalf("the failing step: %v, want the run's error", err)
	}
	if !grew {
		t.Fatal("the failing step did not grow its Regions: the test tests nothing")
	}
	if n := h.charged(t, "after the failed step"); n != before {
		t.Fatalf("after the failed step: charged %d, want the %d of the 48 tokens", n, before)
	}
	q.beforeRun = nil
	if _, err := q.Step(ctx, int64(full)); err != nil {
		t.Fatal(err)
	}
	if n := h.charged(t, "49 tokens"); n != kvBytes(full+1) {
		t.Fatalf("49 tokens: charged %d, want %d", n, kvBytes(full+1))
	}
}

// TestDecoderCancelledWaitIsTheContexts: a step whose context ends while
// another sequence's growth holds the turn fails with a *GrowError that
// matches the context's error (not memapi.ErrInUse), whose Wanted is the
// granules its Regions would hold.
func TestDecoderCancelledWaitIsTheContexts(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q := newSequence(t, d)
	d.growTurn <- struct{}{} // another sequence grows
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := q.Step(ctx, 1)
	<-d.growTurn
	var ge *GrowError
	if !errors.As(err, &ge) || !errors.Is(err, context.Canceled) || errors.Is(err, memapi.ErrInUse) {
		t.Fatalf("a cancelled wait for the turn: %v, want a *GrowError matching context.Canceled, not ErrInUse", err)
	}
	if ge.Wanted != kvBytes(1) {
		t.Fatalf("Wanted %d, want %d: the granules of one token in every Region", ge.Wanted, kvBytes(1))
	}
	if n := h.charged(t, "after the cancelled step"); n != 0 {
		t.Fatalf("charged %d after the cancelled step", n)
	}
}

// TestDecoderCancelledStepStopsTheRun: a step whose context ends while
// its Run is under way stops it (the run options' terminate flag): the
// error is the context's, the step's growth is given back, the sequence
// holds its tokens as before, and its next step gives the logits an
// uninterrupted sequence gives.
func TestDecoderCancelledStepStopsTheRun(t *testing.T) {
	h := newKVHost(t, 64<<20)
	d := newDecoder(t, h.bind, KVGrow)
	q, fresh := newSequence(t, d), newSequence(t, d)
	bg := context.Background()
	full := int(kvGranule / decRowBytes) // the next step grows every Region
	for i := range full {
		if _, err := q.Step(bg, int64(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := fresh.Step(bg, int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := h.charged(t, "16 tokens twice")
	ctx, cancel := context.WithCancel(bg)
	set := make(chan struct{})
	q.terminated = func() { close(set) }
	q.beforeRun = func() error {
		cancel()
		<-set // the flag is up before the Run starts
		return nil
	}
	_, err := q.Step(ctx, int64(full))
	q.beforeRun, q.terminated = nil, nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a step cancelled as its Run starts: %v, want context.Canceled", err)
	}
	if n := h.charged(t, "after the stopped run"); n != before || q.Tokens() != full {
		t.Fatalf("after the stopped run: charged %d (before %d), %d tokens", n, before, q.Tokens())
	}
	got, err := q.Step(bg, int64(full))
	if err != nil {
		t.Fatal(err)
	}
	want, err := fresh.Step(bg, int64(full))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatal("the step after a stopped run gives other logits than an uninterrupted sequence")
	}
}
