package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// batchRun decodes n sequences together in one context of m (NCtx 512
// each): prompts of very different lengths (1 to 200 tokens) in one
// DecodeBatch, then steps greedy tokens for every sequence at once. Halfway,
// the odd sequences finish (ResetSeq) and their slots start new prompts.
// It returns, per slot, every greedy token it produced; after (when set)
// runs after the prompts and after every step.
func batchRun(t *testing.T, m *Model, n, steps int, after func(c *Context, step int)) [][]int32 {
	t.Helper()
	ctx := bg(t)
	c, err := m.NewContext(ctx, ContextOptions{NCtx: 512, Sequences: n})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(bg(t)); err != nil {
			t.Error(err)
		}
	}()
	out := make([][]int32, n)
	in := make([]SeqTokens, n)
	for i := range n {
		in[i] = SeqTokens{Seq: i, Tokens: prompt(i, 1+(i*53)%200, m.NVocab())}
	}
	for step := -1; step < steps; step++ {
		next, err := c.DecodeBatch(ctx, in)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if after != nil {
			after(c, step)
		}
		for i, tok := range next {
			out[in[i].Seq] = append(out[in[i].Seq], tok)
			in[i] = SeqTokens{Seq: in[i].Seq, Tokens: []int32{tok}}
		}
		if step == steps/2 {
			for i := 1; i < n; i += 2 {
				if err := c.ResetSeq(ctx, i); err != nil {
					t.Fatal(err)
				}
				in[i].Tokens = prompt(100+i, 3+7*i, m.NVocab())
			}
		}
	}
	return out
}

// TestBatchTokensMatchStock: for the tiny model and the GQA one (8 layers,
// GQA 4:1, head size 128, F16, a real vocabulary), one context decodes 1,
// 4 and 16 sequences together, each in its own KV stream whose ranges grow (sparse commits in
// one region per tensor) as the sequence does; the greedy tokens of every
// sequence equal stock llama.cpp's, run with the same n_seq_max and the
// same batches; after the prompts and after every step the ledger equals
// each stream's committed rows (its cells, rounded up to the granule) plus
// the compute buffers, the mechanism's count and mincore. Finished
// sequences give their ranges back and their slots start over without
// touching the others'.
func TestBatchTokensMatchStock(t *testing.T) {
	const steps = 48
	for _, model := range []struct{ name, path string }{{"tiny", modelPath}, {"gqa", gqaModelPath}} {
		t.Run(model.name, func(t *testing.T) { batchMatchStock(t, model.path, steps) })
	}
}

func batchMatchStock(t *testing.T, path string, steps int) {
	stock := loadModelAt(t, path, Options{Stock: true})
	r := newRig(t, 1<<30)
	m := loadModelAt(t, path, r.options())
	for _, n := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("seqs=%d", n), func(t *testing.T) {
			want := batchRun(t, stock, n, steps, nil)
			audits := 0
			got := batchRun(t, m, n, steps, func(c *Context, step int) {
				r.audit(t, fmt.Sprintf("%d sequences, step %d", n, step), m, c)
				audits++
			})
			for i := range n {
				if hashTokens(got[i]) != hashTokens(want[i]) {
					t.Errorf("sequence %d: greedy tokens differ from stock's:\nstock  %v\nmemgen %v", i, want[i], got[i])
				}
			}
			t.Logf("%d sequences x %d steps: tokens equal stock's, %d audits exact", n, steps, audits)
			r.audit(t, "closed", m)
		})
	}
}

// TestBatchBadInput: a batch naming a sequence outside the context's, or
// one twice, is memapi.ErrInvalidRange; an entry without tokens
// memapi.ErrInvalidSize; several sequences of an n_ctx that llama.cpp
// would pad are refused at NewContext; nothing is charged by any refusal.
func TestBatchBadInput(t *testing.T) {
	r := newRig(t, 1<<30)
	m := loadModel(t, r.options())
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 300, Sequences: 4}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Fatalf("n_ctx 300 with 4 sequences: got %v, want ErrInvalidSize", err)
	}
	if _, err := m.NewContext(bg(t), ContextOptions{NCtx: 256, Sequences: 257}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Fatalf("257 sequences: got %v, want ErrInvalidSize", err)
	}
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 256, Sequences: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range [][]SeqTokens{
		{{Seq: 4, Tokens: []int32{1}}},
		{{Seq: -1, Tokens: []int32{1}}},
		{{Seq: 1, Tokens: []int32{1}}, {Seq: 1, Tokens: []int32{2}}},
	} {
		if _, err := c.DecodeBatch(bg(t), in); !errors.Is(err, memapi.ErrInvalidRange) {
			t.Errorf("%v: got %v, want ErrInvalidRange", in, err)
		}
	}
	if _, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: []int32{1}}, {Seq: 2}}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("an entry without tokens: got %v, want ErrInvalidSize", err)
	}
	if err := c.ResetSeq(bg(t), 4); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("ResetSeq(4): got %v, want ErrInvalidRange", err)
	}
	r.audit(t, "after the refusals", m, c)
	if kv := c.KV(); kv.Committed != 0 || kv.Cells != 0 {
		t.Errorf("after the refusals: %+v", kv)
	}
	if err := c.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
}

// batchChild is the child of TestBatchReadsOnlyItsRows: 16 sequences of
// prompts of 1 to 196 tokens in one context, each stream committed to
// exactly the rows its sequence touches, then one token each (short: every
// stream's growth one row short, which leaves sequence 3's new row, the
// first of a granule after its 160 cells, unbacked).
func batchChild(ctx context.Context, m *Model, short bool) int {
	c, err := m.NewContext(ctx, ContextOptions{NCtx: 512, Sequences: 16})
	if err != nil {
		fmt.Println("child:", err)
		return 3
	}
	in := make([]SeqTokens, 16)
	shortest, longest := 1<<30, 0
	for i := range in {
		in[i] = SeqTokens{Seq: i, Tokens: prompt(i, 1+(i*53)%200, m.NVocab())}
		shortest, longest = min(shortest, len(in[i].Tokens)), max(longest, len(in[i].Tokens))
	}
	next, err := c.DecodeBatch(ctx, in)
	if err != nil {
		fmt.Println("child:", err)
		return 3
	}
	for i := range in {
		in[i].Tokens = []int32{next[i]}
	}
	if short {
		rowsShort = 1
	}
	fmt.Printf("child: 16 sequences of %d to %d cells, stepping with %d bytes committed\n", shortest, longest, c.KV().Committed)
	if _, err := c.DecodeBatch(ctx, in); err != nil {
		fmt.Println("child:", err)
		return 3
	}
	fmt.Println("child: decoded a step of 16 sequences")
	return 0
}

// TestBatchReadsOnlyItsRows: with 16 sequences of very different lengths
// in one context, llama.cpp pads the rows it attends to the longest
// stream's, but reads only each sequence's own (the rows past a sequence's
// length are masked, and the CPU kernel skips them): a child process with
// every stream committed to exactly its sequence's rows decodes, and one
// row short it faults.
func TestBatchReadsOnlyItsRows(t *testing.T) {
	out, err := faultChild(t, "batch16")
	if err != nil || !strings.Contains(out, "child: decoded a step of 16 sequences") {
		t.Fatalf("exact commit: %v\n%s", err, out)
	}
	out, err = faultChild(t, "batch16-short")
	if err == nil || !strings.Contains(out, "SIGSEGV") || strings.Contains(out, "child: decoded a step") {
		t.Fatalf("one row short: want a segmentation fault in the step, got %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(out[strings.Index(out, "SIGSEGV"):], "\n")
	t.Logf("one row short: %v: %s", err, first)
}

// TestDecreasingOrderIsEachRowAlone: a step of several sequences' decode
// tokens listed in decreasing order of their sequences computes every
// sequence's logits exactly as a step of that sequence alone; listed in
// increasing order it does not (the GQA model: up to 0.0047 apart). The
// server decodes its steps in decreasing order for this.
func TestDecreasingOrderIsEachRowAlone(t *testing.T) {
	r := newRig(t, 4<<30)
	m := loadModelAt(t, gqaModelPath, r.options())
	prompt := func(s int) []int32 {
		p := make([]int32, 8+s)
		for i := range p {
			p[i] = int32(10 + (s*37+i*13)%900)
		}
		return p
	}
	// run decodes the sequences of order together, in that order, and
	// returns each one's top logits over 12 steps.
	run := func(order []int) map[int][]TopLogits {
		c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512, Sequences: 9})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(bg(t))
		next := map[int]int32{}
		for _, s := range order {
			out, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: s, Tokens: prompt(s)}})
			if err != nil {
				t.Fatal(err)
			}
			next[s] = out[0]
		}
		res := map[int][]TopLogits{}
		for range 12 {
			in := make([]SeqTokens, len(order))
			tops := make([]TopLogits, len(order))
			for k, s := range order {
				in[k] = SeqTokens{Seq: s, Tokens: []int32{next[s]}, Top: &tops[k]}
			}
			out, err := c.DecodeBatch(bg(t), in)
			if err != nil {
				t.Fatal(err)
			}
			for k, s := range order {
				next[s] = out[k]
				res[s] = append(res[s], tops[k])
			}
		}
		return res
	}
	alone := map[int][]TopLogits{}
	for _, s := range []int{1, 2, 3, 5, 8} {
		alone[s] = run([]int{s})[s]
	}
	for _, order := range [][]int{{3, 2, 1}, {8, 5, 3, 2, 1}} {
		for s, tops := range run(order) {
			if !slices.Equal(tops, alone[s]) {
				t.Errorf("order %v: sequence %d's logits differ from it alone", order, s)
			}
		}
	}
	same := 0
	for s, tops := range run([]int{1, 2, 3, 5, 8}) {
		if slices.Equal(tops, alone[s]) {
			same++
		}
	}
	if same == 5 {
		t.Errorf("in increasing order every sequence's logits equal it alone too: the test shows nothing")
	}
	r.settle(t)
}
