package llamacpp

import (
	"fmt"
	"testing"

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
