package llamacpp

import (
	"testing"
	"time"
)

// batchBenchSeqs sequences, prompts of 128 to 1,024 tokens (128 apart),
// batchBenchGen greedy tokens generated for each, llama.cpp on two threads.
const (
	batchBenchSeqs = 8
	batchBenchGen  = 256
	batchBenchNCtx = 1280 // the longest prompt and its tokens, a multiple of 256
)

// batchBenchPrompt is sequence i's prompt.
func batchBenchPrompt(i, vocab int) []int32 { return prompt(50+i, 128*(i+1), vocab) }

// batchSide is one engine's context of the benchmark's sequences, decoded
// together: its inputs for the next DecodeBatch, its tokens, its time.
type batchSide struct {
	c    *Context
	in   []SeqTokens
	out  [][]int32
	took time.Duration
}

func openBatched(b *testing.B, m *Model) *batchSide {
	b.Helper()
	c, err := m.NewContext(bg(b), ContextOptions{NCtx: batchBenchNCtx, Sequences: batchBenchSeqs})
	if err != nil {
		b.Fatal(err)
	}
	s := &batchSide{c: c, in: make([]SeqTokens, batchBenchSeqs), out: make([][]int32, batchBenchSeqs)}
	for i := range s.in {
		s.in[i] = SeqTokens{Seq: i, Tokens: batchBenchPrompt(i, m.NVocab())}
	}
	return s
}

// step decodes the side's inputs (the prompts first, then one token of
// every sequence) in one DecodeBatch.
func (s *batchSide) step(b *testing.B) {
	start := time.Now()
	next, err := s.c.DecodeBatch(bg(b), s.in)
	s.took += time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	for i, t := range next {
		s.out[i] = append(s.out[i], t)
		s.in[i].Tokens = []int32{t}
	}
}

func (s *batchSide) close(b *testing.B) {
	if err := s.c.Close(bg(b)); err != nil {
		b.Error(err)
	}
}

// runPerContext decodes the same sequences one context each (the layout
// of one context per sequence): each prompt in its context, then one token
// of every sequence per step, context after context.
func runPerContext(b *testing.B, m *Model) ([][]int32, time.Duration) {
	b.Helper()
	cs := make([]*Context, batchBenchSeqs)
	for i := range cs {
		c, err := m.NewContext(bg(b), ContextOptions{NCtx: batchBenchNCtx})
		if err != nil {
			b.Fatal(err)
		}
		cs[i] = c
	}
	defer func() {
		for _, c := range cs {
			if err := c.Close(bg(b)); err != nil {
				b.Error(err)
			}
		}
	}()
	out := make([][]int32, batchBenchSeqs)
	next := make([]int32, batchBenchSeqs)
	start := time.Now()
	for i, c := range cs {
		t, err := c.Decode(bg(b), batchBenchPrompt(i, m.NVocab()))
		if err != nil {
			b.Fatal(err)
		}
		next[i] = t
	}
	for range batchBenchGen - 1 {
		for i, c := range cs {
			out[i] = append(out[i], next[i])
			t, err := c.Decode(bg(b), []int32{next[i]})
			if err != nil {
				b.Fatal(err)
			}
			next[i] = t
		}
	}
	for i := range out {
		out[i] = append(out[i], next[i])
	}
	return out, time.Since(start)
}

// BenchmarkBatchDecode: 8 sequences (prompts of 128 to 1,024 tokens, 256
// greedy tokens each, two threads) three ways: stock llama.cpp decoding
// them together in one context (n_seq_max 8, one KV stream per sequence)
// and memgen's device the same way (each stream's ranges growing in one
// region per tensor), the two alternating call by call; then memgen's
// device with one context per sequence. It reports each side's tokens per
// second (prompt and generated tokens over the time of the decodes),
// memgen's batched throughput over stock's (vs-stock) and over the
// per-context layout's (vs-per-context), and fails unless memgen's
// batched tokens equal stock's.
func BenchmarkBatchDecode(b *testing.B) {
	stock := loadModel(b, Options{Stock: true, Threads: 2})
	r := newRig(b, 1<<30)
	ours := loadModel(b, Options{Manager: r.mgr, Governor: r.g, Device: r.host, Threads: 2})
	tokens := 0
	for i := range batchBenchSeqs {
		tokens += len(batchBenchPrompt(i, 1)) + batchBenchGen - 1
	}
	var tStock, tOurs, tPer time.Duration
	for range b.N {
		// The batched sides alternate call by call (which goes first
		// alternates too), so that a shared machine's load falls on both
		// alike.
		st, us := openBatched(b, stock), openBatched(b, ours)
		for k := range batchBenchGen {
			if k%2 == 0 {
				st.step(b)
				us.step(b)
			} else {
				us.step(b)
				st.step(b)
			}
		}
		st.close(b)
		us.close(b)
		tStock += st.took
		tOurs += us.took
		for i := range st.out {
			if hashTokens(us.out[i]) != hashTokens(st.out[i]) {
				b.Fatalf("sequence %d: memgen's batched tokens differ from stock's", i)
			}
		}
		_, d := runPerContext(b, ours)
		tPer += d
	}
	n := float64(tokens * b.N)
	b.ReportMetric(n/tStock.Seconds(), "stock-batched-tok/s")
	b.ReportMetric(n/tOurs.Seconds(), "memgen-batched-tok/s")
	b.ReportMetric(n/tPer.Seconds(), "memgen-per-context-tok/s")
	b.ReportMetric(tStock.Seconds()/tOurs.Seconds(), "vs-stock")
	b.ReportMetric(tPer.Seconds()/tOurs.Seconds(), "vs-per-context")
}
