package ort

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/procmem"
	"github.com/memgen/memgen/memreport"
)

// symbolicLength makes a tensor type's second dimension (the length) the
// dim_param sequence_length.
func symbolicLength(tt []byte) []byte {
	return rewrite(tt, 2, func(_ int, sh []byte) []byte {
		return rewrite(sh, 1, func(k int, dim []byte) []byte {
			if k != 1 {
				return dim
			}
			return protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "sequence_length")
		})
	})
}

// perHeadPrompt returns the per-head decoder with input_ids [1,
// sequence_length] and logits [1, sequence_length, vocab]: scripts/ort.sh
// declares a length of 1 (a Run of one token), which its graph does not
// need.
func perHeadPrompt(t *testing.T) string {
	t.Helper()
	needDecoder(t)
	return editIO(t, decoderModel, "perhead-prompt", func(_ bool, vi []byte) []byte {
		if n := name(vi); n == inIDs || n == outLogits {
			return tensorType(vi, symbolicLength)
		}
		return vi
	})
}

// promptOf returns n prompt tokens from from.
func promptOf(from, n int) []int64 {
	p := make([]int64, n)
	for i := range p {
		p[i] = int64((from+i)*37+5) % 1024
	}
	return p
}

// TestPrefillPerHead prefills 100 tokens into the per-head decoder as
// scripts/ort.sh builds it (its input_ids and logits declare a length of
// 1: PrefillChunk is 1, a Run per token) and into the same decoder
// declaring a symbolic length (one Run), in KVGrow and KVPreallocated,
// beside a sequence fed the prompt one Step at a time. KVGrow grows each
// of the 16 Regions once for the prompt (16 growths) to 100 rows in whole
// granules: the ledger, the mechanism and mincore equal kvBytes(100). The
// Run-per-token prefill gives the token-by-token logits exactly; the one
// Run, the same next token (its logits within float rounding, logged);
// 32 greedy steps after give the same tokens.
func TestPrefillPerHead(t *testing.T) {
	oneRun := perHeadPrompt(t)
	prompt := promptOf(0, 100)
	for _, c := range []struct {
		path  string
		mode  KVMode
		chunk int
	}{
		{decoderModel, KVGrow, 1},
		{oneRun, KVGrow, 0},
		{oneRun, KVPreallocated, 0},
	} {
		t.Run(c.mode.String()+map[int]string{0: "/one-run", 1: "/run-per-token"}[c.chunk], func(t *testing.T) {
			h, h1 := newKVHost(t, 64<<20), newKVHost(t, 64<<20)
			d, err := NewDecoder(c.path, h.bind, DecoderOptions{Mode: c.mode, MaxSeq: decMaxSeq})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.PrefillChunk() != c.chunk {
				t.Fatalf("PrefillChunk %d, want %d", d.PrefillChunk(), c.chunk)
			}
			q := newSequence(t, d)
			byToken := newSequence(t, newDecoder(t, h1.bind, c.mode))
			growths := 0
			q.afterGrow = func(int) { growths++ }
			got, err := q.Prefill(context.Background(), prompt)
			if err != nil {
				t.Fatal(err)
			}
			q.afterGrow = nil
			var want []float32
			for _, tok := range prompt {
				if want, err = byToken.Step(context.Background(), tok); err != nil {
					t.Fatal(err)
				}
			}
			n := h.charged(t, "prefilled")
			switch c.mode {
			case KVGrow:
				if n != kvBytes(100) || growths != decTensors {
					t.Fatalf("100 tokens prefilled: charged %d, %d Region growths; want %d and %d (one per Region)", n, growths, kvBytes(100), decTensors)
				}
			case KVPreallocated:
				if n != decTensors*decMaxSeq*decRowBytes {
					t.Fatalf("charged %d, want the %d Buffers", n, decTensors)
				}
			}
			diff := maxDiff(got, want)
			if c.chunk == 1 && diff != 0 || argmax(got) != argmax(want) {
				t.Fatalf("after the prompt: next token %d prefilled, %d token by token, max |logit difference| %g", argmax(got), argmax(want), diff)
			}
			for i := range 32 {
				tok := argmax(got)
				if got, err = q.Step(context.Background(), tok); err != nil {
					t.Fatal(err)
				}
				if want, err = byToken.Step(context.Background(), tok); err != nil {
					t.Fatal(err)
				}
				diff = max(diff, maxDiff(got, want))
				if argmax(got) != argmax(want) {
					t.Fatalf("step %d after the prompt: token %d, %d token by token", i, argmax(got), argmax(want))
				}
			}
			if st := q.Stats(); st.Tokens != 132 {
				t.Fatalf("%d tokens, want 132", st.Tokens)
			}
			t.Logf("%v, chunk %d: 100 tokens prefilled, 32 greedy steps, the same tokens as token by token; max |logit difference| %g", c.mode, c.chunk, diff)
		})
	}
}

// TestPrefillFailuresLeaveTheSequence: a Prefill of 100 tokens into a
// KVGrow sequence of 20 fails four ways, each after (or instead of) its
// growth, and leaves the sequence as it was: 20 tokens, the ledger, the
// mechanism and mincore at kvBytes(20), and its next Prefill of the same
// tokens gives the logits of a sequence never refused:
//   - over budget (a *GrowError over budget within its deadline,
//     Tokens 120, Held kvBytes(20));
//   - a failed Run (here before it; a Run's failure takes the same path);
//   - the context cancelled as its Run starts (the terminate flag);
//   - in Runs of 32, the context cancelled during the second Run, and a
//     failure of the fourth (the growth was for all four).
func TestPrefillFailuresLeaveTheSequence(t *testing.T) {
	oneRun := perHeadPrompt(t)
	bg := context.Background()
	start, prompt := promptOf(0, 20), promptOf(20, 100)
	for _, c := range []struct {
		what  string
		chunk int
		fail  func(t *testing.T, h *kvHost, q *Sequence)
	}{
		{"over budget", 0, func(t *testing.T, h *kvHost, q *Sequence) {
			// Room for 70 tokens beside the fresh sequence's 120: the
			// prompt wants 120.
			if err := h.g.SetCapacity(hostAuth, kvBytes(120)+kvBytes(70)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			_, err := q.Prefill(ctx, prompt)
			var ge *GrowError
			if !errors.As(err, &ge) || !errors.Is(err, memapi.ErrOverBudget) || ge.Tokens != 120 || ge.Held != kvBytes(20) || ge.Wanted != kvBytes(120) {
				t.Fatalf("a prompt over budget: %v (%+v); want a *GrowError over budget, Tokens 120, Held %d, Wanted %d", err, ge, kvBytes(20), kvBytes(120))
			}
			if err := h.g.SetCapacity(hostAuth, 64<<20); err != nil {
				t.Fatal(err)
			}
		}},
		{"a failed Run", 0, func(t *testing.T, h *kvHost, q *Sequence) {
			boom := errors.New("the run failed")
			grew := false
			q.beforeRun = func() error {
				grew = q.backed[0] >= 120*decRowBytes
				return boom
			}
			_, err := q.Prefill(bg, prompt)
			q.beforeRun = nil
			if !errors.Is(err, boom) || !grew {
				t.Fatalf("a failing Run: %v (grown to the prompt before it: %v); want the Run's error after the growth", err, grew)
			}
		}},
		{"cancelled as the Run starts", 0, func(t *testing.T, h *kvHost, q *Sequence) {
			ctx, cancel := context.WithCancel(bg)
			set := make(chan struct{})
			q.terminated = func() { close(set) }
			q.beforeRun = func() error {
				cancel()
				<-set
				return nil
			}
			_, err := q.Prefill(ctx, prompt)
			q.beforeRun, q.terminated = nil, nil
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a prompt cancelled as its Run starts: %v, want context.Canceled", err)
			}
		}},
		{"cancelled in the second of four Runs", 32, func(t *testing.T, h *kvHost, q *Sequence) {
			ctx, cancel := context.WithCancel(bg)
			runs := 0
			q.beforeRun = func() error {
				if runs++; runs == 2 {
					cancel()
				}
				return nil
			}
			_, err := q.Prefill(ctx, prompt)
			q.beforeRun = nil
			if !errors.Is(err, context.Canceled) || runs != 2 {
				t.Fatalf("a prompt cancelled in its second Run: %v after %d Runs, want context.Canceled after 2", err, runs)
			}
		}},
		{"the fourth of four Runs failed", 32, func(t *testing.T, h *kvHost, q *Sequence) {
			boom := errors.New("the run failed")
			runs := 0
			q.beforeRun = func() error {
				if runs++; runs == 4 {
					return boom
				}
				return nil
			}
			_, err := q.Prefill(bg, prompt)
			q.beforeRun = nil
			if !errors.Is(err, boom) || runs != 4 {
				t.Fatalf("a prompt whose fourth Run failed: %v after %d Runs", err, runs)
			}
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			h := newKVHost(t, 64<<20)
			d, err := NewDecoder(oneRun, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: decMaxSeq, PrefillChunk: c.chunk})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			q, fresh := newSequence(t, d), newSequence(t, d)
			for _, s := range []*Sequence{q, fresh} {
				if _, err := s.Prefill(bg, start); err != nil {
					t.Fatal(err)
				}
			}
			want, err := fresh.Prefill(bg, prompt)
			if err != nil {
				t.Fatal(err)
			}
			want = slices.Clone(want)
			before := h.charged(t, "before") - kvBytes(120)
			if before != kvBytes(20) {
				t.Fatalf("charged %d for 20 tokens, want %d", before, kvBytes(20))
			}
			c.fail(t, h, q)
			if n, st := h.charged(t, "after the failure")-kvBytes(120), q.Stats(); n != before || st.Tokens != 20 || st.Backed != before {
				t.Fatalf("after the failure: charged %d, backed %d, %d tokens; want %d and 20 tokens", n, st.Backed, st.Tokens, before)
			}
			got, err := q.Prefill(bg, prompt)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("the prompt after the failure: logits differ from a sequence never refused by %g", maxDiff(got, want))
			}
			if n := h.charged(t, "prefilled"); n != 2*kvBytes(120) {
				t.Fatalf("both at 120 tokens: charged %d, want %d", n, 2*kvBytes(120))
			}
		})
	}
}

// TestPrefillConcatFailureKeepsThePasts: in KVConcat, Runs of 32 tokens
// bind each Run's presents as the next Run's pasts; a prompt whose third
// Run fails binds the pasts the sequence had again and frees the presents
// made since (the OrtValues it holds are those before), so its next
// Prefill gives the logits of a sequence never refused.
func TestPrefillConcatFailureKeepsThePasts(t *testing.T) {
	oneRun := perHeadPrompt(t)
	bg := context.Background()
	d, err := NewDecoder(oneRun, nil, DecoderOptions{Mode: KVConcat, MaxSeq: decMaxSeq, PrefillChunk: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	q, fresh := newSequence(t, d), newSequence(t, d)
	start, prompt := promptOf(0, 20), promptOf(20, 100)
	for _, s := range []*Sequence{q, fresh} {
		if _, err := s.Prefill(bg, start); err != nil {
			t.Fatal(err)
		}
	}
	want, err := fresh.Prefill(bg, prompt)
	if err != nil {
		t.Fatal(err)
	}
	want = slices.Clone(want)
	pasts, err := q.bindings()
	if err != nil {
		t.Fatal(err)
	}
	owned := len(q.owned)
	boom := errors.New("the run failed")
	runs := 0
	q.beforeRun = func() error {
		if runs++; runs == 3 {
			return boom
		}
		return nil
	}
	if _, err := q.Prefill(bg, prompt); !errors.Is(err, boom) || runs != 3 {
		t.Fatalf("a prompt whose third Run failed: %v after %d Runs", err, runs)
	}
	q.beforeRun = nil
	now, err := q.bindings()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(now, pasts) || len(q.owned) != owned || q.Tokens() != 20 {
		t.Fatalf("after the failure: pasts %v (were %v), %d values held (were %d), %d tokens", now, pasts, len(q.owned), owned, q.Tokens())
	}
	got, err := q.Prefill(bg, prompt)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the prompt after the failure: logits differ from a sequence never refused by %g", maxDiff(got, want))
	}
}

// TestPrefillBadInput: an empty prompt is memapi.ErrInvalidSize; a prompt
// beyond MaxSeq and one with a token outside the vocabulary are
// memapi.ErrInvalidRange; a Prefill during a Step is memapi.ErrInUse, and
// after Close memapi.ErrClosed; a negative PrefillChunk is
// memapi.ErrInvalidSize. None changes the sequence or the ledger.
func TestPrefillBadInput(t *testing.T) {
	h := newKVHost(t, 64<<20)
	oneRun := perHeadPrompt(t)
	if _, err := NewDecoder(oneRun, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 64, PrefillChunk: -1}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("PrefillChunk -1: %v, want ErrInvalidSize", err)
	}
	d, err := NewDecoder(oneRun, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	q := newSequence(t, d)
	ctx := context.Background()
	if _, err := q.Prefill(ctx, promptOf(0, 10)); err != nil {
		t.Fatal(err)
	}
	before := h.charged(t, "10 tokens")
	for _, c := range []struct {
		what   string
		tokens []int64
		want   error
	}{
		{"an empty prompt", nil, memapi.ErrInvalidSize},
		{"55 tokens after 10 with MaxSeq 64", promptOf(10, 55), memapi.ErrInvalidRange},
		{"a token of -1", append(promptOf(10, 5), -1), memapi.ErrInvalidRange},
		{"a token of the vocabulary's size", append(promptOf(10, 5), int64(d.Vocab())), memapi.ErrInvalidRange},
	} {
		if _, err := q.Prefill(ctx, c.tokens); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		} else {
			t.Log(err)
		}
	}
	var inner error
	q.beforeRun = func() error {
		q.beforeRun = nil
		_, inner = q.Prefill(ctx, promptOf(11, 4))
		return nil
	}
	if _, err := q.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(inner, memapi.ErrInUse) {
		t.Errorf("a Prefill during a Step: %v, want ErrInUse", inner)
	}
	if n, st := h.charged(t, "after the refusals"), q.Stats(); n != before || st.Tokens != 11 {
		t.Fatalf("after the refusals: charged %d (before %d), %d tokens (want 11)", n, before, st.Tokens)
	}
	if _, err := q.Prefill(ctx, promptOf(11, 53)); err != nil {
		t.Fatalf("a prompt to MaxSeq exactly: %v", err)
	}
	if n := h.charged(t, "full"); n != kvBytes(64) {
		t.Fatalf("64 tokens: charged %d, want %d", n, kvBytes(64))
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Prefill(ctx, promptOf(0, 2)); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("Prefill after Close: %v, want ErrClosed", err)
	}
}

// TestPrefillBytesInProportion: GenAI's model builder's layout with a
// maximum of 2,048 tokens, a prompt of 1,024 prefilled, each mode in a
// process of its own. The KV bytes charged in KVGrow (each layer's Region
// holding each KV head's 1,024 rows) against KVPreallocated's (each
// layer's Buffer of 2 heads × 2,048 rows) are at most 0.55 of them (the
// exact figure: 0.5); in each child the ledger, the mechanism and
// mincore agree. Reported beside it: each child's resident-set growth
// over the second sequence's Prefill (the first, closed, warmed ONNX
// Runtime's arena for a Run of 1,024 tokens, so that the growth is the
// cache's).
func TestPrefillBytesInProportion(t *testing.T) {
	if mode := os.Getenv("MEMGEN_ORT_KV_CHILD"); mode != "" {
		if err := kvChild(mode); err != nil {
			t.Fatal(err)
		}
		return
	}
	needExported(t)
	if raceEnabled {
		t.Skip("the race detector's shadow memory grows with the process: the resident set is not the engine's")
	}
	type fig struct{ charged, rss uint64 }
	got := map[KVMode]fig{}
	for _, mode := range []KVMode{KVGrow, KVPreallocated} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPrefillBytesInProportion$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "MEMGEN_ORT_KV_CHILD="+mode.String())
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%v child: %v\n%s", mode, err, out)
		}
		var f fig
		i := bytes.Index(out, []byte("kv-child:"))
		if _, err := fmt.Sscanf(string(out[max(i, 0):]), "kv-child: charged %d rss %d", &f.charged, &f.rss); i < 0 || err != nil {
			t.Fatalf("%v child: no figures (%v) in\n%s", mode, err, out)
		}
		got[mode] = f
	}
	g, p := got[KVGrow], got[KVPreallocated]
	perHead, _ := memapi.RoundUp(1024*256, kvGranule)
	if g.charged != uint64(perHead)*expKVHeads*expTensors || p.charged != expKVHeads*expTensors*2048*256 {
		t.Fatalf("charged %d (KVGrow) and %d (KVPreallocated); want %d and %d", g.charged, p.charged, uint64(perHead)*expKVHeads*expTensors, expKVHeads*expTensors*2048*256)
	}
	ratio := float64(g.charged) / float64(p.charged)
	t.Logf("1,024 tokens of 2,048 prefilled: KV charged %s (KVGrow) vs %s (KVPreallocated), %.3f of it; resident set grew %s vs %s over the Prefill",
		memreport.FormatBytes(memapi.Bytes(g.charged)), memreport.FormatBytes(memapi.Bytes(p.charged)), ratio,
		memreport.FormatBytes(memapi.Bytes(g.rss)), memreport.FormatBytes(memapi.Bytes(p.rss)))
	if ratio > 0.55 {
		t.Fatalf("KVGrow charged %.3f of the preallocated buffer's bytes at half its length, want ≤ 0.55", ratio)
	}
}

// kvChild is TestPrefillBytesInProportion's process: it prefills 1,024
// tokens into a sequence of the GenAI model in mode (a KVMode's String)
// and prints the KV bytes charged and the resident set's growth over that
// Prefill.
func kvChild(mode string) error {
	m := map[string]KVMode{KVGrow.String(): KVGrow, KVPreallocated.String(): KVPreallocated}[mode]
	if err := WarmUp(); err != nil {
		return err
	}
	ce, err := newChildEngine()
	if err != nil {
		return err
	}
	defer ce.close()
	d, err := NewDecoder(genaiMaskModel, ce.kvBind, DecoderOptions{Mode: m, MaxSeq: 2048})
	if err != nil {
		return err
	}
	defer d.Close()
	ctx := context.Background()
	prompt := promptOf(0, 1024)
	warm, err := d.NewSequence(ctx)
	if err != nil {
		return err
	}
	if _, err := warm.Prefill(ctx, prompt); err != nil {
		return err
	}
	if err := warm.Close(); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ce.ectx.Queue().Drain(dctx); err != nil {
		return err
	}
	base, err := procmem.Baseline()
	if err != nil {
		return err
	}
	q, err := d.NewSequence(ctx)
	if err != nil {
		return err
	}
	defer q.Close()
	if _, err := q.Prefill(ctx, prompt); err != nil {
		return err
	}
	now, err := procmem.Self()
	if err != nil {
		return err
	}
	s, _ := ce.g.Authority(hostAuth)
	kern, err := ce.m.KernelBytes()
	if err != nil {
		return err
	}
	if s.Charged != ce.m.UsedBytes() || kern != s.Charged || q.Stats().Backed != s.Charged {
		return fmt.Errorf("charged %d, mechanism %d, kernel %d, sequence backed %d", s.Charged, ce.m.UsedBytes(), kern, q.Stats().Backed)
	}
	fmt.Printf("kv-child: charged %d rss %d\n", s.Charged, now.RSS-base.RSS)
	return nil
}
