package ort

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// expBytes is what a KVGrow sequence of an exported layout holds at
// tokens tokens: each KV head's rows of 256 bytes rounded up to the
// granule, × 2 heads × 4 cache tensors.
func expBytes(tokens int) memapi.Bytes {
	per, _ := memapi.RoundUp(memapi.Bytes(tokens)*256, kvGranule)
	return per * expKVHeads * expTensors
}

// openExported opens path in mode over h (nil: no binding) with MaxSeq
// maxSeq, closed at the test's end.
func openExported(t *testing.T, path string, h *kvHost, mode KVMode, maxSeq int) *Decoder {
	t.Helper()
	needExported(t)
	d, err := NewDecoder(path, h.bind, DecoderOptions{Mode: mode, MaxSeq: maxSeq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func newBatch(t *testing.T, d *Decoder, slots int) *Batch {
	t.Helper()
	b, err := d.NewBatch(context.Background(), slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// batchSeq is a sequence of a batch and its twin decoded alone.
type batchSeq struct {
	q, alone *Sequence
	tok      int64
	name     string
}

// TestBatchDecode decodes 4 sequences of prompts of 1, 40, 300 and 700
// tokens in a Batch of 4 slots of GenAI's layout (attention_mask;
// seqlens_k and total_sequence_length), each prompt prefilled alone in
// its slot, then 48 greedy steps of Batch.Step, the sequences given in
// reverse slot order; beside each, the same sequence decoded alone
// (Decoder.NewSequence, Prefill, Step) on a decoder of its own. The
// sequence of 40 finishes after step 16 (Close): its slot is free, the
// others step in two Runs (slots 0 and 2-3); at step 24 a new sequence
// takes the slot, its prompt of 100 tokens prefilled alone in it, and
// steps with the others (one Run again). After every step:
//   - every sequence's greedy token equals its twin's (the largest logit
//     difference is logged);
//   - KVGrow: the ledger, the mechanism and mincore equal the live
//     sequences' slabs (each KV head's rows in whole granules), and the
//     batch's Backed; the finished sequence's slabs are gone, the others'
//     untouched; KVPreallocated: the 4 Buffers of 4 slots;
//   - Runs: one per step while the slots are contiguous, two with the
//     hole; OrtValues made: the attention_mask's header per Run only.
//
// After Close every host is at 0.
func TestBatchDecode(t *testing.T) {
	for _, c := range []struct {
		path string
		mode KVMode
	}{
		{genaiMaskModel, KVGrow},
		{genaiSeqlensModel, KVGrow},
		{genaiMaskModel, KVPreallocated},
	} {
		t.Run(fmt.Sprintf("%s/%v", filepath.Base(c.path), c.mode), func(t *testing.T) {
			const slots, steps, finishAt, reuseAt = 4, 48, 16, 24
			h, ha := newKVHost(t, 256<<20), newKVHost(t, 256<<20)
			d := openExported(t, c.path, h, c.mode, expMaxSeq)
			alone := openExported(t, c.path, ha, c.mode, expMaxSeq)
			b := newBatch(t, d, slots)
			ctx := context.Background()
			perMask := 0
			if d.mask >= 0 {
				perMask = 1
			}
			start := func(n int) *batchSeq {
				t.Helper()
				q, err := b.NewSequence(ctx)
				if err != nil {
					t.Fatal(err)
				}
				a, err := alone.NewSequence(ctx)
				if err != nil {
					t.Fatal(err)
				}
				prompt := promptOf(n, n)
				lq, err := q.Prefill(ctx, prompt)
				if err != nil {
					t.Fatal(err)
				}
				la, err := a.Prefill(ctx, prompt)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(lq, la) {
					t.Fatalf("prompt of %d prefilled in slot %d: logits differ from the sequence's alone by %g", n, q.slot, maxDiff(lq, la))
				}
				return &batchSeq{q: q, alone: a, tok: argmax(lq), name: fmt.Sprintf("prompt %d, slot %d", n, q.slot)}
			}
			var live []*batchSeq
			for _, n := range []int{1, 40, 300, 700} {
				live = append(live, start(n))
			}
			audit := func(what string) {
				t.Helper()
				var want memapi.Bytes
				for _, s := range live {
					want += expBytes(s.q.Tokens())
				}
				if c.mode == KVPreallocated {
					want = expTensors * slots * expKVHeads * expMaxSeq * 256
				}
				if n, st := h.charged(t, what), b.Stats(); n != want || st.Backed != want || st.Sequences != len(live) {
					t.Fatalf("%s: charged %d, batch backed %d, %d sequences; want %d (the live sequences' slabs) and %d", what, n, st.Backed, st.Sequences, want, len(live))
				}
			}
			audit("prefilled")
			var diff float64
			for i := range steps {
				switch i {
				case finishAt:
					s := live[1]
					if err := errors.Join(s.q.Close(), s.alone.Close()); err != nil {
						t.Fatal(err)
					}
					live = slices.Delete(live, 1, 2)
					audit("a sequence finished")
				case reuseAt:
					s := start(100)
					if s.q.slot != 1 {
						t.Fatalf("the new sequence took slot %d, want the free slot 1", s.q.slot)
					}
					live = append(live, s)
					audit("a sequence in the reused slot")
				}
				seqs := make([]*Sequence, len(live))
				toks := make([]int64, len(live))
				for k, s := range live {
					// In reverse slot order: Step runs them by slot.
					seqs[len(live)-1-k], toks[len(live)-1-k] = s.q, s.tok
				}
				runs, values := b.Stats().Runs, valuesMade()
				ls, err := b.Step(ctx, seqs, toks)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				wantRuns := 1
				if i >= finishAt && i < reuseAt {
					wantRuns = 2 // slot 0, then slots 2 and 3
				}
				if r := b.Stats().Runs - runs; r != wantRuns {
					t.Fatalf("step %d: %d Runs, want %d", i, r, wantRuns)
				}
				if i != 0 && i != finishAt && i != reuseAt {
					if n := valuesMade() - values; n != int64(perMask*wantRuns) {
						t.Fatalf("step %d: %d OrtValues made, want %d", i, n, perMask*wantRuns)
					}
				}
				for k, s := range live {
					got := ls[len(live)-1-k]
					want, err := s.alone.Step(ctx, s.tok)
					if err != nil {
						t.Fatal(err)
					}
					diff = max(diff, maxDiff(got, want))
					if argmax(got) != argmax(want) {
						t.Fatalf("step %d: %s: token %d in the batch, %d alone (max |logit difference| %g)", i, s.name, argmax(got), argmax(want), maxDiff(got, want))
					}
					if s.q.Tokens() != s.alone.Tokens() {
						t.Fatalf("step %d: %s: %d tokens, %d alone", i, s.name, s.q.Tokens(), s.alone.Tokens())
					}
					s.tok = argmax(got)
				}
				audit(fmt.Sprintf("step %d", i))
			}
			t.Logf("%v, %v: 4 sequences (prompts 1, 40, 300, 700), the second finished after %d steps and its slot reused (prompt 100), %d steps of Batch.Step: the same greedy tokens as each sequence alone, max |logit difference| %g; %d Runs, %d tensors made",
				d.Layout(), c.mode, finishAt, steps, diff, b.Stats().Runs, b.Stats().TensorsMade)
			for _, s := range live {
				if err := errors.Join(s.q.Close(), s.alone.Close()); err != nil {
					t.Fatal(err)
				}
			}
			live = nil
			audit("closed")
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if n := h.charged(t, "batch closed"); n != 0 {
				t.Fatalf("charged %d after the batch closed", n)
			}
		})
	}
}

// TestBatchFailuresLeaveEverySequence: a Batch of 4 slots holds
// sequences of 16, 32 and 48 tokens in slots 0, 2 and 3 (slot 1's closed:
// two Runs per step), so that the next step grows every one's slabs by a
// granule. The step fails four ways and leaves every sequence as it was
// (tokens, the ledger, the mechanism and mincore), and the step after
// gives logits equal, bit for bit, to a twin batch never refused:
//   - over budget: room for one sequence's growth (a *GrowError over
//     budget within the deadline);
//   - a failed Run (the first, after every growth);
//   - the second of the two Runs failed (the first ran);
//   - the context cancelled as the first Run starts (the terminate flag).
func TestBatchFailuresLeaveEverySequence(t *testing.T) {
	bg := context.Background()
	for _, c := range []struct {
		what string
		fail func(t *testing.T, h *kvHost, b *Batch, step func(context.Context) error)
	}{
		{"over budget", func(t *testing.T, h *kvHost, b *Batch, step func(context.Context) error) {
			now := h.charged(t, "before")
			if err := h.g.SetCapacity(hostAuth, now+expBytes(16)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			err := step(ctx)
			var ge *GrowError
			if !errors.As(err, &ge) || !errors.Is(err, memapi.ErrOverBudget) {
				t.Fatalf("a step over budget: %v, want a *GrowError over budget", err)
			}
			if err := h.g.SetCapacity(hostAuth, 256<<20); err != nil {
				t.Fatal(err)
			}
		}},
		{"a failed Run", func(t *testing.T, h *kvHost, b *Batch, step func(context.Context) error) {
			boom := errors.New("the run failed")
			grew := false
			b.beforeRun = func() error {
				grew = b.Stats().Backed == expBytes(17)+expBytes(33)+expBytes(49)
				return boom
			}
			err := step(bg)
			b.beforeRun = nil
			if !errors.Is(err, boom) || !grew {
				t.Fatalf("a failing Run: %v (grown before it: %v); want the Run's error after the growth", err, grew)
			}
		}},
		{"the second Run failed", func(t *testing.T, h *kvHost, b *Batch, step func(context.Context) error) {
			boom := errors.New("the run failed")
			runs := 0
			b.beforeRun = func() error {
				if runs++; runs == 2 {
					return boom
				}
				return nil
			}
			err := step(bg)
			b.beforeRun = nil
			if !errors.Is(err, boom) || runs != 2 {
				t.Fatalf("a step whose second Run failed: %v after %d Runs", err, runs)
			}
		}},
		{"cancelled as the Run starts", func(t *testing.T, h *kvHost, b *Batch, step func(context.Context) error) {
			ctx, cancel := context.WithCancel(bg)
			set := make(chan struct{})
			b.terminated = func() { close(set) }
			b.beforeRun = func() error {
				cancel()
				<-set
				return nil
			}
			err := step(ctx)
			b.beforeRun, b.terminated = nil, nil
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a step cancelled as its Run starts: %v, want context.Canceled", err)
			}
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			type side struct {
				h    *kvHost
				b    *Batch
				seqs []*Sequence
			}
			mk := func() *side {
				h := newKVHost(t, 256<<20)
				d := openExported(t, genaiMaskModel, h, KVGrow, expMaxSeq)
				s := &side{h: h, b: newBatch(t, d, 4)}
				var all []*Sequence
				for range 4 {
					q, err := s.b.NewSequence(bg)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { q.Close() })
					all = append(all, q)
				}
				for k, n := range []int{16, 99, 32, 48} {
					q := all[k]
					if _, err := q.Prefill(bg, promptOf(k, n)); err != nil {
						t.Fatal(err)
					}
					if k == 1 {
						if err := q.Close(); err != nil {
							t.Fatal(err)
						}
						continue
					}
					s.seqs = append(s.seqs, q)
				}
				return s
			}
			x, twin := mk(), mk()
			toks := []int64{3, 5, 7}
			before := x.h.charged(t, "before")
			if before != expBytes(16)+expBytes(32)+expBytes(48) {
				t.Fatalf("charged %d, want %d", before, expBytes(16)+expBytes(32)+expBytes(48))
			}
			c.fail(t, x.h, x.b, func(ctx context.Context) error {
				_, err := x.b.Step(ctx, x.seqs, toks)
				return err
			})
			if n := x.h.charged(t, "after the failure"); n != before || x.b.Stats().Backed != before {
				t.Fatalf("after the failure: charged %d, backed %d; want %d", n, x.b.Stats().Backed, before)
			}
			for k, q := range x.seqs {
				if q.Tokens() != []int{16, 32, 48}[k] {
					t.Fatalf("after the failure: sequence %d holds %d tokens", k, q.Tokens())
				}
			}
			got, err := x.b.Step(bg, x.seqs, toks)
			if err != nil {
				t.Fatal(err)
			}
			want, err := twin.b.Step(bg, twin.seqs, toks)
			if err != nil {
				t.Fatal(err)
			}
			for k := range got {
				if !slices.Equal(got[k], want[k]) {
					t.Fatalf("sequence %d: the step after the failure gives logits other than a batch never refused (by %g)", k, maxDiff(got[k], want[k]))
				}
			}
			if n := x.h.charged(t, "stepped"); n != expBytes(17)+expBytes(33)+expBytes(49) {
				t.Fatalf("stepped: charged %d, want %d", n, expBytes(17)+expBytes(33)+expBytes(49))
			}
		})
	}
}

// TestBatchBadInput: what NewBatch, Batch.NewSequence and Batch.Step
// refuse, each a typed error that changes nothing: no tokens, no bytes
// charged, no sequence stepping after it.
func TestBatchBadInput(t *testing.T) {
	h := newKVHost(t, 256<<20)
	ctx := context.Background()
	needExported(t)
	cat, err := NewDecoder(optimumModel, nil, DecoderOptions{Mode: KVConcat, MaxSeq: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	if _, err := cat.NewBatch(ctx, 2); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("a batch of Optimum's concat layout: %v, want ErrUnsupported", err)
	} else {
		t.Log(err)
	}
	genaiCat := openExported(t, genaiMaskModel, h, KVConcat, 64)
	if _, err := genaiCat.NewBatch(ctx, 2); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("a KVConcat batch: %v, want ErrUnsupported", err)
	}
	perHead := newDecoder(t, h.bind, KVGrow)
	if _, err := perHead.NewBatch(ctx, 2); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("a batch of the per-head layout: %v, want ErrUnsupported", err)
	}
	d := openExported(t, genaiMaskModel, h, KVGrow, 64)
	for _, n := range []int{0, -1, 1025} {
		if _, err := d.NewBatch(ctx, n); !errors.Is(err, memapi.ErrInvalidSize) {
			t.Errorf("a batch of %d slots: %v, want ErrInvalidSize", n, err)
		}
	}
	b, other := newBatch(t, d, 2), newBatch(t, d, 1)
	q0, err := b.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q1, err := b.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.NewSequence(ctx); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("a third sequence in a batch of 2: %v, want ErrInUse", err)
	} else {
		t.Log(err)
	}
	foreign, err := other.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := d.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []*Sequence{q0, q1, foreign, alone} {
		if _, err := q.Prefill(ctx, promptOf(0, 10)); err != nil {
			t.Fatal(err)
		}
	}
	before := h.charged(t, "10 tokens each")
	for _, c := range []struct {
		what string
		seqs []*Sequence
		toks []int64
		want error
	}{
		{"no sequences", nil, nil, memapi.ErrInvalidSize},
		{"2 sequences, 1 token", []*Sequence{q0, q1}, []int64{1}, memapi.ErrInvalidSize},
		{"3 sequences in a batch of 2", []*Sequence{q0, q1, foreign}, []int64{1, 2, 3}, memapi.ErrInvalidSize},
		{"another batch's sequence", []*Sequence{q0, foreign}, []int64{1, 2}, memapi.ErrForeignHandle},
		{"a sequence of no batch", []*Sequence{alone, q1}, []int64{1, 2}, memapi.ErrForeignHandle},
		{"a nil sequence", []*Sequence{q0, nil}, []int64{1, 2}, memapi.ErrForeignHandle},
		{"the same sequence twice", []*Sequence{q0, q0}, []int64{1, 2}, memapi.ErrInUse},
		{"a token of -1", []*Sequence{q0, q1}, []int64{1, -1}, memapi.ErrInvalidRange},
		{"a token of the vocabulary's size", []*Sequence{q0, q1}, []int64{int64(d.Vocab()), 1}, memapi.ErrInvalidRange},
	} {
		if _, err := b.Step(ctx, c.seqs, c.toks); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		} else {
			t.Log(err)
		}
	}
	// A Step of the batch or of a sequence in it while a Step runs.
	var inner, innerSeq error
	b.beforeRun = func() error {
		b.beforeRun = nil
		_, inner = b.Step(ctx, []*Sequence{q1}, []int64{1})
		_, innerSeq = q0.Step(ctx, 1)
		return nil
	}
	if _, err := b.Step(ctx, []*Sequence{q0}, []int64{1}); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, memapi.ErrInUse) || !errors.Is(innerSeq, memapi.ErrInUse) {
		t.Errorf("during a Step: Batch.Step %v, Sequence.Step %v; want ErrInUse", inner, innerSeq)
	}
	if q0.Tokens() != 11 || q1.Tokens() != 10 {
		t.Fatalf("tokens %d and %d, want 11 and 10", q0.Tokens(), q1.Tokens())
	}
	// A full sequence, then a closed one.
	if _, err := q1.Prefill(ctx, promptOf(10, 54)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Step(ctx, []*Sequence{q0, q1}, []int64{1, 2}); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("a full sequence: %v, want ErrInvalidRange", err)
	}
	if err := q1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Step(ctx, []*Sequence{q0, q1}, []int64{1, 2}); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("a closed sequence: %v, want ErrClosed", err)
	}
	if q0.Tokens() != 11 {
		t.Fatalf("q0 holds %d tokens after the refusals, want 11", q0.Tokens())
	}
	if n := h.charged(t, "after the refusals"); n != before+expBytes(11)-expBytes(10)-expBytes(10) {
		t.Fatalf("after the refusals: charged %d, want %d", n, before+expBytes(11)-expBytes(10)-expBytes(10))
	}
	if err := b.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("Batch.Close with a sequence open: %v, want ErrInUse", err)
	}
	if err := d.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("Decoder.Close with a batch open: %v, want ErrInUse", err)
	}
	for _, q := range []*Sequence{q0, foreign, alone} {
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.NewSequence(ctx); err != nil {
		t.Fatalf("a sequence in a freed slot: %v", err)
	}
	if err := b.seqs[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(b.Close(), other.Close()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.NewSequence(ctx); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("NewSequence after Close: %v, want ErrClosed", err)
	}
	if _, err := b.Step(ctx, []*Sequence{q0}, []int64{1}); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("Step after Close: %v, want ErrClosed", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := h.charged(t, "closed"); n != 0 {
		t.Fatalf("charged %d after everything closed", n)
	}
}

// TestBatchCloseDuringStep: a sequence closed while a Batch.Step that
// runs it is under way keeps its slabs until the step ends, then gives
// them and its slot back; the others keep theirs, and the slot takes a new
// sequence.
func TestBatchCloseDuringStep(t *testing.T) {
	h := newKVHost(t, 256<<20)
	d := openExported(t, genaiMaskModel, h, KVGrow, expMaxSeq)
	b := newBatch(t, d, 2)
	ctx := context.Background()
	q0, err := b.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q0.Close()
	q1, err := b.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []*Sequence{q0, q1} {
		if _, err := q.Prefill(ctx, promptOf(0, 20)); err != nil {
			t.Fatal(err)
		}
	}
	var during memapi.Bytes
	b.beforeRun = func() error {
		b.beforeRun = nil
		if err := q1.Close(); err != nil {
			return err
		}
		during = h.charged(t, "closed during the step")
		return nil
	}
	if _, err := b.Step(ctx, []*Sequence{q0, q1}, []int64{1, 2}); err != nil {
		t.Fatal(err)
	}
	if during != 2*expBytes(21) {
		t.Fatalf("during the step: charged %d, want both sequences' %d", during, 2*expBytes(21))
	}
	if n := h.charged(t, "after the step"); n != expBytes(21) {
		t.Fatalf("after the step: charged %d, want the open sequence's %d", n, expBytes(21))
	}
	q2, err := b.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q2.Close()
	if q2.slot != 1 {
		t.Fatalf("the new sequence took slot %d, want 1", q2.slot)
	}
}
