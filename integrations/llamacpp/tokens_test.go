package llamacpp

import (
	"fmt"
	"hash/fnv"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// prompt returns n tokens of the vocabulary, different for each seed.
func prompt(seed, n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((seed*7919 + i*104729 + 13) % vocab)
	}
	return p
}

func hashTokens(ts []int32) uint64 {
	h := fnv.New64a()
	for _, t := range ts {
		h.Write([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(t >> 24)})
	}
	return h.Sum64()
}

// generator decodes greedily, one context per sequence, the contexts in
// turn (step i of every sequence, then step i+1), calling after (if set)
// after every decode.
type generator struct {
	t      testing.TB
	ctxs   []*Context
	next   []int32
	out    [][]int32
	after  func(step int)
	prompt int
}

func newGenerator(t testing.TB, m *Model, n, nCtx, promptLen int) *generator {
	t.Helper()
	return newGeneratorWith(t, m, n, promptLen, ContextOptions{NCtx: nCtx})
}

// newGeneratorWith is newGenerator with each context's options.
func newGeneratorWith(t testing.TB, m *Model, n, promptLen int, opts ContextOptions) *generator {
	t.Helper()
	g := &generator{t: t, prompt: promptLen}
	for i := range n {
		c, err := m.NewContext(bg(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.Close(bg(t)); err != nil && !isClosed(err) {
				t.Error(err)
			}
		})
		g.ctxs = append(g.ctxs, c)
		g.out = append(g.out, nil)
		next, err := c.Decode(bg(t), prompt(i, promptLen, m.NVocab()))
		if err != nil {
			t.Fatal(err)
		}
		g.next = append(g.next, next)
	}
	return g
}

func (g *generator) run(steps int) {
	g.t.Helper()
	for s := range steps {
		for i, c := range g.ctxs {
			tok := g.next[i]
			g.out[i] = append(g.out[i], tok)
			next, err := c.Decode(bg(g.t), []int32{tok})
			if err != nil {
				g.t.Fatalf("context %d, step %d: %v", i, s, err)
			}
			g.next[i] = next
		}
		if g.after != nil {
			g.after(s)
		}
	}
}

func (g *generator) hashes() []uint64 {
	var hs []uint64
	for _, o := range g.out {
		hs = append(hs, hashTokens(o))
	}
	return hs
}

// audit checks, at a quiescent point, that for every context the
// governor's charge to its holder, the regions' committed bytes and the
// rows in use agree (each tensor's rows × row bytes rounded up to the
// granule), that the weights are charged to their holder, and that the
// authority's charge equals the mechanism's UsedBytes and mincore's count.
func (r *rig) audit(t testing.TB, what string, m *Model, ctxs ...*Context) {
	t.Helper()
	r.settle(t)
	var total memapi.Bytes
	for i, c := range ctxs {
		kv := c.KV()
		c.mu.Lock()
		var want memapi.Bytes
		for _, tn := range c.tensors {
			for _, sq := range c.seqs {
				if sq.moved != nil {
					continue // its KV cache waits in the host tier
				}
				n, _ := memapi.RoundUp(memapi.Bytes(sq.cells)*tn.rowBytes, tn.region.Granularity())
				want += n
			}
		}
		c.mu.Unlock()
		// The compute and output buffers are charged beside the KV
		// cache, committed whole from the context's creation.
		compute := c.Compute()
		if got := r.charged(c.Holder()); got != want+compute || kv.Committed != want || compute == 0 {
			t.Errorf("%s: context %d (%d cells): governor charges %d, regions commit %d, rows need %d, compute buffers %d",
				what, i, kv.Cells, got, kv.Committed, want, compute)
		}
		total += want + compute
	}
	wantW, _ := memapi.RoundUp(m.WeightBytes(), 4<<10)
	if got := r.charged(m.Holder()); got != wantW || wantW == 0 {
		t.Errorf("%s: weights holder charged %d, its buffers hold %d", what, got, wantW)
	}
	s, _ := r.g.Authority(hostAuth)
	used := r.mech.UsedBytes()
	kern, err := r.mech.KernelBytes()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Balanced() || s.Pending != 0 || s.Reserved != 0 || s.Charged != total+wantW+r.extra || used != s.Charged || kern != used {
		t.Errorf("%s: authority charged %d (pending %d, reserved %d, balanced %v), contexts %d + weights %d + others %d; mechanism %d, mincore %d",
			what, s.Charged, s.Pending, s.Reserved, s.Balanced(), total, wantW, r.extra, used, kern)
	}
}

// TestTokensMatchStockOneContext: one context decodes the same greedy
// tokens on memgen's device as on stock llama.cpp (same library, same
// model), and after every decode the accounts are exact.
func TestTokensMatchStockOneContext(t *testing.T) {
	const steps = 300
	stock := loadModel(t, Options{Stock: true})
	want := newGenerator(t, stock, 1, 2048, 17)
	want.run(steps)

	r := newRig(t, 1<<30)
	m := loadModel(t, r.options())
	got := newGenerator(t, m, 1, 2048, 17)
	r.audit(t, "after the prompt", m, got.ctxs...)
	got.after = func(s int) { r.audit(t, fmt.Sprintf("step %d", s), m, got.ctxs...) }
	got.run(steps)
	if a, b := hashTokens(want.out[0]), hashTokens(got.out[0]); a != b {
		t.Fatalf("greedy tokens differ: stock %x, memgen %x\nstock  %v\nmemgen %v", a, b, want.out[0][:32], got.out[0][:32])
	}
	distinct := map[int32]bool{}
	for _, tok := range got.out[0] {
		distinct[tok] = true
	}
	t.Logf("%d tokens (%d distinct), hash %x (stock and memgen); first %v", steps, len(distinct), hashTokens(got.out[0]), got.out[0][:12])
	closeAll(t, got.ctxs)
	r.audit(t, "after close", m)
	if n := r.charged(got.ctxs[0].Holder()); n != 0 {
		t.Errorf("closed context still charged %d", n)
	}
}

// TestTokensMatchStockEightContexts: 8 contexts, 1,024 steps each,
// interleaved, give the same greedy tokens on memgen's device as on stock
// llama.cpp; the accounts are exact every 64 steps and 0 for the KV after
// close.
func TestTokensMatchStockEightContexts(t *testing.T) {
	steps := 1024
	if testing.Short() {
		steps = 128
	}
	stock := loadModel(t, Options{Stock: true})
	want := newGenerator(t, stock, 8, 2048, 9)
	want.run(steps)

	r := newRig(t, 1<<30)
	m := loadModel(t, r.options())
	got := newGenerator(t, m, 8, 2048, 9)
	got.after = func(s int) {
		if s%64 == 63 {
			r.audit(t, fmt.Sprintf("step %d", s), m, got.ctxs...)
		}
	}
	got.run(steps)
	wh, gh := want.hashes(), got.hashes()
	for i := range wh {
		if wh[i] != gh[i] {
			t.Errorf("context %d: greedy tokens differ: stock %x, memgen %x", i, wh[i], gh[i])
		}
	}
	t.Logf("8 contexts x %d steps: hashes %x", steps, gh)
	closeAll(t, got.ctxs)
	r.audit(t, "after close", m)
}

func closeAll(t testing.TB, cs []*Context) {
	t.Helper()
	for _, c := range cs {
		if err := c.Close(bg(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResetReleasesAndRestarts: Reset drops the sequence
// (llama_memory_seq_rm) and its regions' backing, refunded behind the
// decode fences: the context's holder is charged 0 and stays registered;
// the same prompt then decodes to the same tokens as the first time.
func TestResetReleasesAndRestarts(t *testing.T) {
	r := newRig(t, 1<<30)
	m := loadModel(t, r.options())
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	run := func() []int32 {
		next, err := c.Decode(bg(t), prompt(9, 70, m.NVocab()))
		if err != nil {
			t.Fatal(err)
		}
		var out []int32
		for range 40 {
			out = append(out, next)
			if next, err = c.Decode(bg(t), []int32{next}); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	first := run()
	r.audit(t, "before the reset", m, c)
	if err := c.Reset(bg(t)); err != nil {
		t.Fatal(err)
	}
	r.audit(t, "after the reset", m, c)
	if n, kv := r.charged(c.Holder()), c.KV(); n != c.Compute() || kv.Committed != 0 || kv.Cells != 0 || len(c.Tokens()) != 0 {
		t.Fatalf("after the reset: holder charged %d (compute buffers %d), %+v, %d tokens", n, c.Compute(), kv, len(c.Tokens()))
	}
	if again := run(); hashTokens(again) != hashTokens(first) {
		t.Fatalf("after the reset the same prompt gave other tokens:\n%v\n%v", first, again)
	}
	r.audit(t, "after the second run", m, c)
	if err := c.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	r.auditEmpty(t, "after close", m)
}
