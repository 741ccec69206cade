package llamacpp

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/integrations/llamacpp/internal/trace"
)

// traceFile is the Azure LLM inference trace 2023 (conversation;
// Splitwise, CC-BY 4.0), relative to this package: the excerpt memdemo
// replays (the first 2,000 requests), of which the test takes 24.
var traceFile = filepath.Join("..", "..", "cmd", "memdemo", "trace", "azure-llm-conv-2023-excerpt.csv")

// hostHeld is what the host tier holds of c's offloaded sequences (c.mu
// taken).
func hostHeld(c *Context) memapi.Bytes {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n memapi.Bytes
	for _, sq := range c.seqs {
		for _, o := range sq.moved {
			if o != nil {
				n += o.Bytes()
			}
		}
	}
	return n
}

// seqMoved reports whether sequence s of c is offloaded, and whether
// every tensor holding rows of it is (never half).
func seqMoved(c *Context, s int) (moved, whole bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sq := c.seqs[s]
	if sq.moved == nil {
		return false, true
	}
	for i, t := range c.tensors {
		if t.backed[s] > 0 && sq.moved[i] == nil {
			return true, false
		}
	}
	return true, true
}

// exactBoth is audit's check of the device, and the host tier's charge
// equal to the offloaded sequences' bytes and to its mechanism's.
func exactBoth(t testing.TB, r *rig, tier *hostTier, what string, m *Model, c *Context) {
	t.Helper()
	r.audit(t, what, m, c)
	exactTiers(t, r, tier)
	if got, want := r.chargedOn("sleep", offloadAuth), hostHeld(c); got != want {
		t.Fatalf("%s: the host tier charges %d, the offloaded sequences hold %d", what, got, want)
	}
}

// replayed is one replay of a trace slice through one context.
type replayed struct {
	out   [][]int32 // per request, its generated tokens
	tops  [][]TopLogits
	st    Stats
	wall  time.Duration
	calls int
	peak  memapi.Bytes // the most the KV regions committed after a call
}

// replayTrace replays rs through c, a context of several sequences: each
// request takes a free sequence in order (ResetSeq of the one that ran
// there before), and at each step every running request decodes in a call
// of its own (its prompt first, then its last token), so that its
// arithmetic is the same whatever else runs; a request whose tokens are
// out is finished (FinishSeq), its cells kept until its sequence is taken
// again. after runs after each call.
func replayTrace(t *testing.T, c *Context, rs []trace.Request, after func(call int)) replayed {
	t.Helper()
	type job struct {
		id, seq int
		out     []int32
	}
	res := replayed{out: make([][]int32, len(rs)), tops: make([][]TopLogits, len(rs))}
	var free []int
	for s := c.Sequences() - 1; s >= 0; s-- {
		free = append(free, s)
	}
	var running []*job
	next := 0
	start := time.Now()
	for next < len(rs) || len(running) > 0 {
		for next < len(rs) && len(free) > 0 {
			s := free[len(free)-1]
			free = free[:len(free)-1]
			if len(c.SeqTokens(s)) > 0 {
				if err := c.ResetSeq(bg(t), s); err != nil {
					t.Fatal(err)
				}
			}
			running = append(running, &job{id: next, seq: s})
			next++
		}
		keep := running[:0]
		for _, j := range running {
			toks := prompt(j.id, rs[j.id].Prompt, c.m.NVocab())
			if len(j.out) > 0 {
				toks = j.out[len(j.out)-1:]
			}
			var top TopLogits
			tok, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: j.seq, Tokens: toks, Top: &top}})
			res.tops[j.id] = append(res.tops[j.id], top)
			if err != nil {
				t.Fatalf("request %d (sequence %d), token %d: %v", j.id, j.seq, len(j.out), err)
			}
			j.out = append(j.out, tok[0])
			res.calls++
			res.peak = max(res.peak, c.KV().Committed)
			if after != nil {
				after(res.calls)
			}
			if len(j.out) == rs[j.id].Gen {
				res.out[j.id] = j.out
				if err := c.FinishSeq(j.seq); err != nil {
					t.Fatal(err)
				}
				free = append(free, j.seq)
				continue
			}
			keep = append(keep, j)
		}
		running = keep
	}
	res.wall = time.Since(start)
	res.st = c.Stats()
	return res
}

// TestOffloadVsRecomputeTrace replays a slice of the Azure LLM inference
// trace 2023 (Splitwise, CC-BY 4.0): its first 24 requests, lengths scaled
// so that the longest fills n_ctx 512, through one context of 8
// sequences, first with the budget free, then under a KV budget of half
// the peak the free run committed, once per preemption policy: every
// victim offloaded to the host tier, every victim recomputed, and the
// automatic policy. The pressure comes from the context's own calls: a
// call that must commit more asks the governor for room first, and the
// context gives up sequences the call does not name. Every request's
// greedy tokens are the free run's; both tiers' ledgers are exact every
// 16 calls and at the end, and empty after close. One line per policy:
// offload-vs-recompute: policy= preemptions= offloads= restores=
// recomputed= moved= wall=.
func TestOffloadVsRecomputeTrace(t *testing.T) {
	const requests, seqs, nctx = 24, 8, 512
	rs, err := trace.Read(traceFile, requests)
	if err != nil {
		t.Fatal(err)
	}
	rs = trace.Scale(rs, nctx-1)
	// Ubatches of 32 tokens: a recomputed sequence's tokens are then
	// bit-identical (see TestSeqOffloadFaultAtEveryStep).
	opts := ContextOptions{NCtx: nctx, Sequences: seqs, UBatch: 32}

	free := newRig(t, 1<<30)
	fm := loadModel(t, free.options())
	fc, err := fm.NewContext(bg(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	want := replayTrace(t, fc, rs, nil)
	t.Logf("offload-vs-recompute: policy=none (free) preemptions=0 offloads=0 restores=0 recomputed=0 moved=0 wall=%s", want.wall.Round(time.Millisecond))
	compute := fc.Compute()
	stream := memapi.Bytes(nctx) * fc.KV().RowBytes
	if err := fc.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	weights, _ := memapi.RoundUp(fm.WeightBytes(), 4<<10)
	kv := max(want.peak/2, stream+stream/4)
	t.Logf("%d requests, %d tokens, %d calls: KV peak %d, budget %d (one sequence at its longest: %d)",
		len(rs), want.st.Tokens, want.calls, want.peak, kv, stream)

	run := func(policy string) replayed {
		r := newRig(t, weights+compute+kv)
		tier := r.hostTier(t)
		m := loadModel(t, r.options())
		o := opts
		o.OffloadTo, o.Preempt = tier.bind, policy
		c, err := m.NewContext(bg(t), o)
		if err != nil {
			t.Fatal(err)
		}
		got := replayTrace(t, c, rs, func(call int) {
			if call%16 == 0 {
				exactBoth(t, r, tier, fmt.Sprintf("%s, call %d", policyName(policy), call), m, c)
			}
		})
		exactBoth(t, r, tier, policyName(policy)+", the end", m, c)
		for i := range rs {
			if !slices.Equal(got.out[i], want.out[i]) {
				k := 0
				for k < len(got.out[i]) && got.out[i][k] == want.out[i][k] {
					k++
				}
				t.Errorf("%s: request %d: tokens %v, want %v; at %d free top %+v got top %+v", policyName(policy), i, got.out[i], want.out[i], k, want.tops[i][k], got.tops[i][k])
			}
		}
		if err := c.Close(bg(t)); err != nil {
			t.Fatal(err)
		}
		r.auditEmpty(t, policyName(policy)+", after close", m)
		if n := tier.mech.UsedBytes(); n != 0 {
			t.Errorf("%s: the host tier holds %d after the context closed", policyName(policy), n)
		}
		st := got.st
		t.Logf("offload-vs-recompute: policy=%s preemptions=%d offloads=%d restores=%d recomputed=%d moved=%d wall=%s",
			policyName(policy), st.Preemptions, st.Offloads, st.Restores, st.Recomputed, st.Moved, got.wall.Round(time.Millisecond))
		return got
	}
	off, rec := run(preemptOffload), run(preemptRecompute)
	auto := run(preemptAuto)
	if off.st.Offloads == 0 || off.st.Restores == 0 || off.st.Recomputed != 0 || off.st.Moved == 0 {
		t.Errorf("offload: %+v: want offloads and restores, nothing recomputed", off.st)
	}
	if rec.st.Preemptions == 0 || rec.st.Recomputed == 0 || rec.st.Offloads != 0 || rec.st.Moved != 0 {
		t.Errorf("recompute: %+v: want preemptions recomputed, nothing moved", rec.st)
	}
	if auto.st.Preemptions == 0 {
		t.Errorf("auto: %+v: the budget did not press", auto.st)
	}
}

// policyName is a Preempt value as the log line names it.
func policyName(p string) string {
	if p == preemptAuto {
		return "auto"
	}
	return p
}

// undoFaults fails the at-th reservation on one authority, then the first
// one on another after it (a failed move's undo).
type undoFaults struct {
	mu       sync.Mutex
	from, to memapi.AuthorityID
	at, n    int
	failed   []string
}

func (f *undoFaults) arm(from, to memapi.AuthorityID, at int) {
	f.mu.Lock()
	f.from, f.to, f.at, f.n, f.failed = from, to, at, 0, nil
	f.mu.Unlock()
}

func (f *undoFaults) MaybeError(op memapi.Op) error {
	if op.String() != "governor.Reserve" {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.at == 0:
	case len(f.failed) == 0 && op.Authority == f.from:
		if f.n++; f.n == f.at {
			f.failed = append(f.failed, "reservation "+strconv.Itoa(f.at)+" on "+string(f.from))
			return errInjected
		}
	case len(f.failed) == 1 && op.Authority == f.to:
		f.failed = append(f.failed, "the next on "+string(f.to))
		return errInjected
	}
	return nil
}

// injectors asks each injector in turn.
type injectors []memapi.Injector

func (is injectors) MaybeError(op memapi.Op) error {
	for _, i := range is {
		if err := i.MaybeError(op); err != nil {
			return err
		}
	}
	return nil
}

// TestReclaimVictims: Reclaim gives up whole sequences, one at a time,
// until the ticket's bytes are freed: the finished one first, then the
// one with the most KV; a call that names a preempted sequence restores
// it (offloaded) or recomputes it (dropped), the others untouched and
// still preempted. Under the automatic policy a finished victim is
// dropped and a running one offloaded; under "recompute" both are
// dropped. The tokens are an unpressured context's, and both tiers'
// ledgers exact after each step.
func TestReclaimVictims(t *testing.T) {
	lens := []int{40, 200, 120} // sequence 0 finished
	run := func(policy string, pressed bool) [][]int32 {
		r := newRig(t, 1<<30)
		tier := r.hostTier(t)
		m := loadModel(t, r.options())
		c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512, Sequences: 3, OffloadTo: tier.bind, Preempt: policy})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(bg(t))
		out := make([][]int32, len(lens))
		step := func(s int, toks []int32) {
			t.Helper()
			next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: s, Tokens: toks}})
			if err != nil {
				t.Fatal(err)
			}
			out[s] = append(out[s], next[0])
		}
		for s, n := range lens {
			step(s, prompt(s, n, m.NVocab()))
		}
		if err := c.FinishSeq(0); err != nil {
			t.Fatal(err)
		}
		if pressed {
			c.mu.Lock()
			b0, b1 := c.seqBytes(0), c.seqBytes(1)
			c.mu.Unlock()
			// Wanted a byte more than sequence 0 holds: 0 (finished), then
			// 1 (the most KV); 2 stays.
			freed, err := c.Reclaim(bg(t), governor.Ticket{Authority: hostAuth, Wanted: b0 + 1})
			if err != nil || freed != b0+b1 {
				t.Fatalf("%s: Reclaim freed %d (%v), want %d + %d", policyName(policy), freed, err, b0, b1)
			}
			exactBoth(t, r, tier, policyName(policy)+", after the reclaim", m, c)
			st := c.Stats()
			m0, _ := seqMoved(c, 0)
			m1, _ := seqMoved(c, 1)
			wantOff := policy != preemptRecompute
			cells := lens[2] // an offloaded sequence keeps its cells
			if m0 {
				cells += lens[0]
			}
			if m1 {
				cells += lens[1]
			}
			if st.Preemptions != 2 || m0 != (policy == preemptOffload) || m1 != wantOff || c.KV().Cells != cells {
				t.Fatalf("%s: %+v, sequence 0 moved %v, 1 moved %v, %d cells: want 2 preemptions, 1 moved %v", policyName(policy), st, m0, m1, c.KV().Cells, wantOff)
			}
		}
		// Sequence 2 decodes untouched; 1 comes back; 0 stays preempted.
		for range 3 {
			step(2, out[2][len(out[2])-1:])
			step(1, out[1][len(out[1])-1:])
		}
		if pressed {
			exactBoth(t, r, tier, policyName(policy)+", after the calls", m, c)
			if m0, _ := seqMoved(c, 0); m0 != (policy == preemptOffload) {
				t.Fatalf("%s: sequence 0 moved %v after calls that did not name it", policyName(policy), m0)
			}
			if st := c.Stats(); policy != preemptRecompute && st.Restores != 1 || policy == preemptRecompute && st.Recomputed != lens[1] {
				t.Fatalf("%s: %+v", policyName(policy), st)
			}
		}
		step(0, out[0])
		if pressed {
			exactBoth(t, r, tier, policyName(policy)+", the end", m, c)
		}
		return out
	}
	want := run(preemptAuto, false)
	for _, p := range []string{preemptAuto, preemptOffload, preemptRecompute} {
		if got := run(p, true); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s: tokens %v, want %v", policyName(p), got, want)
		}
	}
}

// A fault at every step of a per-sequence offload (each KV tensor's
// reservation on the host tier) and of its restore (the call's room
// reservation, each tensor's reservation on the device, then the
// growth's) leaves both tiers' ledgers exact and the sequence whole:
// after a failed offload it is resident again (Preempt "offload") or
// dropped and recomputed at its next call (the automatic policy); after a
// failed restore it is offloaded as before (or, when the restore got
// through and the growth failed, resident). Every token of both
// sequences is an unpressured context's. UBatch 32 keeps each ubatch on
// the CPU flash-attention kernel's untiled path, whose arithmetic for a
// token does not depend on the batch around it: a recomputed sequence's
// tokens are then bit-identical too.
func TestSeqOffloadFaultAtEveryStep(t *testing.T) {
	opts := ContextOptions{NCtx: 512, Sequences: 2, UBatch: 32}
	p0, p1 := prompt(7, 40, 1024), prompt(8, 150, 1024)
	// start decodes both prompts: sequence 1 holds the most KV, the
	// victim of a ticket for a byte.
	start := func(c *Context) (out [2][]int32) {
		for s, p := range [][]int32{p0, p1} {
			next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: s, Tokens: p}})
			if err != nil {
				t.Fatal(err)
			}
			out[s] = append(out[s], next[0])
		}
		return out
	}
	want := func() [2][]int32 {
		r := newRig(t, 1<<30)
		m := loadModel(t, r.options())
		c, err := m.NewContext(bg(t), opts)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(bg(t))
		out := start(c)
		for s, n := range []int{40, 80} {
			for range n {
				next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: s, Tokens: out[s][len(out[s])-1:]}})
				if err != nil {
					t.Fatal(err)
				}
				out[s] = append(out[s], next[0])
			}
		}
		return out
	}()

	for _, policy := range []string{preemptOffload, preemptAuto} {
		t.Run(policyName(policy), func(t *testing.T) {
			inj, und := &stepFaults{}, &undoFaults{}
			r := newRigWith(t, 1<<30, 4<<10, governor.Options{Injector: injectors{inj, und}})
			tier := r.hostTier(t)
			m := loadModel(t, r.options())
			o := opts
			o.OffloadTo, o.Preempt = tier.bind, policy
			c, err := m.NewContext(bg(t), o)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(bg(t))
			out := start(c)
			// decode decodes sequence s's next token and checks it.
			decode := func(s int, what string) {
				t.Helper()
				next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: s, Tokens: out[s][len(out[s])-1:]}})
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if out[s] = append(out[s], next[0]); len(out[s]) > len(want[s]) {
					t.Fatalf("%s: more tokens than the unpressured run's", what)
				}
				sameTokens(t, what, out[s], want[s][:len(out[s])])
			}
			reclaim := func() (memapi.Bytes, error) {
				return c.Reclaim(bg(t), governor.Ticket{Authority: hostAuth, Wanted: 1})
			}

			for at := 1; ; at++ {
				exactBoth(t, r, tier, "before an offload", m, c)
				inj.arm(offloadAuth, at)
				_, err := reclaim()
				failed := inj.failed
				inj.arm("", 0)
				what := fmt.Sprintf("offload failing at step %d (%s)", at, failed)
				moved, whole := seqMoved(c, 1)
				if !whole {
					t.Fatalf("%s: sequence 1 half offloaded", what)
				}
				if err == nil {
					if !moved {
						t.Fatalf("offload at step %d: sequence 1 not moved", at)
					}
					exactBoth(t, r, tier, "offloaded", m, c)
					t.Logf("offload: a fault at each of its %d steps, then none", at-1)
					break
				}
				c.mu.Lock()
				cells := c.seqs[1].cells
				c.mu.Unlock()
				dropped := policy == preemptAuto
				if !errors.Is(err, errInjected) || moved || (cells == 0) != dropped {
					t.Fatalf("%s: %v (moved %v, %d cells): want the fault and the sequence resident, or dropped under the automatic policy", what, err, moved, cells)
				}
				// With sequence 1 resident, the ticket's next victim,
				// sequence 0, was offloaded instead: its next call
				// restores it.
				if moved, whole := seqMoved(c, 0); moved == dropped || !whole {
					t.Fatalf("%s: sequence 0 moved %v, whole %v", what, moved, whole)
				}
				exactBoth(t, r, tier, what, m, c)
				decode(1, what) // recomputed after a drop
				decode(0, what)
			}

			decode(0, "sequence 0 restored")
			for at := 1; ; at++ {
				if moved, _ := seqMoved(c, 1); !moved {
					if _, err := reclaim(); err != nil {
						t.Fatal(err)
					}
				}
				exactBoth(t, r, tier, "before a restore", m, c)
				inj.arm(hostAuth, at)
				next, err := c.DecodeBatch(bg(t), []SeqTokens{{Seq: 1, Tokens: out[1][len(out[1])-1:]}})
				failed := inj.failed
				inj.arm("", 0)
				what := fmt.Sprintf("restore failing at step %d (%s)", at, failed)
				if err == nil {
					out[1] = append(out[1], next[0])
					sameTokens(t, "after the restore", out[1], want[1][:len(out[1])])
					t.Logf("restore: a fault at each of its %d steps, then none", at-1)
					break
				}
				moved, whole := seqMoved(c, 1)
				if !errors.Is(err, errInjected) || !whole {
					t.Fatalf("%s: %v (moved %v, whole %v)", what, err, moved, whole)
				}
				exactBoth(t, r, tier, what, m, c)
				if c.Stats().Recomputed != 0 && policy == preemptOffload {
					t.Fatalf("%s: %+v: recomputed", what, c.Stats())
				}
			}
			// Two faults: a move's, then its undo's (the first
			// reservation on the other tier after it): the sequence is
			// dropped, never half, and recomputed at its next call.
			for _, x := range []struct {
				what      string
				from, to  memapi.AuthorityID
				preempted bool // the fault is in the restore: offload first
			}{{"offload", offloadAuth, hostAuth, false}, {"restore", hostAuth, offloadAuth, true}} {
				// The fault in the second tensor's move: the first's undo fails.
				at := 2
				if x.preempted {
					at = 3 // the room reservation first
					if moved, _ := seqMoved(c, 1); !moved {
						if _, err := reclaim(); err != nil {
							t.Fatal(err)
						}
					}
				}
				exactBoth(t, r, tier, "before two faults", m, c)
				und.arm(x.from, x.to, at)
				var err error
				if x.preempted {
					_, err = c.DecodeBatch(bg(t), []SeqTokens{{Seq: 1, Tokens: out[1][len(out[1])-1:]}})
				} else {
					_, err = reclaim()
				}
				failed := und.failed
				und.arm("", "", 0)
				what := fmt.Sprintf("%s and its undo failing (%v)", x.what, failed)
				c.mu.Lock()
				cells, moved := c.seqs[1].cells, c.seqs[1].moved
				c.mu.Unlock()
				if !errors.Is(err, errInjected) || len(failed) != 2 || cells != 0 || moved != nil {
					t.Fatalf("%s: %v (%d cells, moved %v): want both faults and the sequence dropped", what, err, cells, moved != nil)
				}
				exactBoth(t, r, tier, what, m, c)
				if mv, _ := seqMoved(c, 0); mv {
					decode(0, what) // the ticket's next victim
				}
				decode(1, what)
			}
			for len(out[1]) < len(want[1]) {
				decode(1, "sequence 1")
			}
			for len(out[0]) < len(want[0]) {
				decode(0, "sequence 0")
			}
			exactBoth(t, r, tier, "the end", m, c)
		})
	}
}
