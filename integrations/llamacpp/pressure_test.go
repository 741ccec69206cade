package llamacpp

import (
	"fmt"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// TestPressurePreemptsAndResumes: three sequences under a budget below
// their demand. When one cannot grow, the governor asks the others' holders
// and an idle one preempts its whole sequence (its KV regions shrink to
// nothing, released behind its fences and refunded); its next decode
// recomputes the sequence. Every sequence's greedy tokens equal an
// unpressured run's, and the accounts are exact every 10 steps and 0 after
// close.
func TestPressurePreemptsAndResumes(t *testing.T) {
	const steps, n, promptLen = 200, 3, 16
	free := newRig(t, 1<<30)
	fm := loadModel(t, free.options())
	want := newGenerator(t, fm, n, 512, promptLen)
	want.run(steps)

	weights, _ := memapi.RoundUp(fm.WeightBytes(), 4<<10)
	// The weights, each context's compute buffers, and 6 MiB of KV:
	// (16+200) tokens x 12 KiB x 3 sequences = 7.6 MiB.
	r := newRig(t, weights+n*want.ctxs[0].Compute()+6<<20)
	m := loadModel(t, r.options())
	got := newGenerator(t, m, n, 512, promptLen)
	got.after = func(s int) {
		if s%10 == 9 {
			r.audit(t, fmt.Sprintf("step %d", s), m, got.ctxs...)
		}
	}
	got.run(steps)
	r.audit(t, "the end", m, got.ctxs...)
	wh, gh := want.hashes(), got.hashes()
	var pre, rec int
	for i, c := range got.ctxs {
		st := c.Stats()
		pre += st.Preemptions
		rec += st.Recomputed
		t.Logf("sequence %d: %d preemptions, %d tokens recomputed, %d decodes", i, st.Preemptions, st.Recomputed, st.Decodes)
		if wh[i] != gh[i] {
			t.Errorf("sequence %d: tokens differ from the unpressured run's: %x, want %x", i, gh[i], wh[i])
		}
	}
	if pre == 0 || rec == 0 {
		t.Fatalf("no preemption (%d) or recomputation (%d): the budget did not press", pre, rec)
	}
	closeAll(t, got.ctxs)
	r.auditEmpty(t, "after close", m)
}

// TestPressureOffloadsAndResumes is TestPressurePreemptsAndResumes with
// the contexts' KV caches moved to a host tier when preempted
// (ContextOptions.OffloadTo) instead of dropped: the same budget below
// the demand, every sequence's tokens those of the unpressured run, and no
// token recomputed; the two policies' preemptions, recomputed tokens,
// bytes moved and wall time side by side.
func TestPressureOffloadsAndResumes(t *testing.T) {
	const steps, n, promptLen = 200, 3, 16
	free := newRig(t, 1<<30)
	fm := loadModel(t, free.options())
	want := newGenerator(t, fm, n, 512, promptLen)
	want.run(steps)
	weights, _ := memapi.RoundUp(fm.WeightBytes(), 4<<10)
	budget := weights + n*want.ctxs[0].Compute() + 6<<20

	type policy struct {
		preemptions, recomputed, offloads, restores int
		moved                                       memapi.Bytes
		wall                                        time.Duration
	}
	run := func(offload bool) policy {
		r := newRig(t, budget)
		m := loadModel(t, r.options())
		opts := ContextOptions{NCtx: 512}
		var tier *hostTier
		if offload {
			tier = r.hostTier(t)
			opts.OffloadTo = tier.bind
		}
		got := newGeneratorWith(t, m, n, promptLen, opts)
		got.after = func(s int) {
			if s%10 == 9 {
				r.audit(t, fmt.Sprintf("step %d", s), m, got.ctxs...)
			}
		}
		start := time.Now()
		got.run(steps)
		var p policy
		p.wall = time.Since(start)
		r.audit(t, "the end", m, got.ctxs...)
		wh, gh := want.hashes(), got.hashes()
		for i, c := range got.ctxs {
			st := c.Stats()
			p.preemptions += st.Preemptions
			p.recomputed += st.Recomputed
			p.offloads += st.Offloads
			p.restores += st.Restores
			p.moved += st.Moved
			if wh[i] != gh[i] {
				t.Errorf("offload %v, sequence %d: tokens differ from the unpressured run's", offload, i)
			}
		}
		closeAll(t, got.ctxs)
		r.auditEmpty(t, "after close", m)
		if tier != nil && tier.mech.UsedBytes() != 0 {
			t.Errorf("the host tier holds %d after the contexts closed", tier.mech.UsedBytes())
		}
		return p
	}
	rec, off := run(false), run(true)
	t.Logf("recompute: %d preemptions, %d tokens recomputed, %v", rec.preemptions, rec.recomputed, rec.wall)
	t.Logf("offload:   %d preemptions (%d moved to the host tier, %d restored, %d bytes moved both ways), %d tokens recomputed, %v",
		off.preemptions, off.offloads, off.restores, off.moved, off.recomputed, off.wall)
	if off.offloads == 0 || off.restores == 0 || off.recomputed != 0 || off.moved == 0 {
		t.Fatalf("offload policy: %+v, want offloads and restores and nothing recomputed", off)
	}
	if rec.recomputed == 0 {
		t.Fatalf("recompute policy: %+v: the budget did not press", rec)
	}
}
