package llamacpp

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp/gguf"
	"github.com/memgen/memgen/memreport"
)

// within reports whether got is within max(2 %, 16 MiB) of want: the
// accuracy a plan promises.
func within(got, want memapi.Bytes) bool {
	tol := max(want/50, 16<<20)
	return got+tol >= want && got <= want+tol
}

// TestPlanMatchesEngine: for the tiny and the GQA models, with one
// sequence and with four, the plan (llama.cpp's sizing with its
// allocations simulated, no weight read) gives exactly the weights, KV
// cache and compute buffers llama.cpp then reports it allocated for a
// stock context of the same configuration; memgen's engine, loaded and
// filled to every sequence's n_ctx, holds in the ledger what the plan
// says at start and at full context, within max(2 %, 16 MiB) (the
// granules' rounding; the ledger does not charge the per-cell bookkeeping,
// which the plan estimates).
func TestPlanMatchesEngine(t *testing.T) {
	for _, c := range []struct {
		name string
		path string
		o    PlanOptions
		fill bool
	}{
		{"tiny/1x2048", modelPath, PlanOptions{NCtx: 2048}, false},
		{"tiny/4x512", modelPath, PlanOptions{NCtx: 512, Sequences: 4, Batch: 256}, true},
		{"gqa/1x2048", gqaModelPath, PlanOptions{NCtx: 2048}, false},
		{"gqa/2x256", gqaModelPath, PlanOptions{NCtx: 256, Sequences: 2, Batch: 128}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := PlanContext(c.path, c.o)
			if err != nil {
				t.Fatal(err)
			}
			opts := ContextOptions{NCtx: c.o.NCtx, Batch: c.o.Batch, UBatch: c.o.UBatch, Sequences: c.o.Sequences}

			// Stock: what llama.cpp reports it allocated.
			sm := loadModelAt(t, c.path, Options{Stock: true})
			sc, err := sm.NewContext(bg(t), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close(bg(t))
			real, err := sc.breakdown()
			if err != nil {
				t.Fatal(err)
			}
			var w, kv, comp memapi.Bytes
			for _, b := range real {
				w, kv, comp = w+b.Model, kv+b.Context, comp+b.Compute
			}
			if w != p.Weights || kv != p.KVFull || comp != p.Compute {
				t.Errorf("plan: weights %d, KV %d, compute %d; stock llama.cpp allocated %d, %d, %d", p.Weights, p.KVFull, p.Compute, w, kv, comp)
			}
			if p.KVPerToken*memapi.Bytes(c.o.NCtx*max(1, c.o.Sequences)) != p.KVFull {
				t.Errorf("KV per token %d x %d cells != KV at full context %d", p.KVPerToken, c.o.NCtx*max(1, c.o.Sequences), p.KVFull)
			}

			// memgen's engine: the ledger at start and at full context.
			r := newRig(t, 1<<32)
			m := loadModelAt(t, c.path, r.options())
			mc, err := m.NewContext(bg(t), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer mc.Close(bg(t))
			ledger := func() memapi.Bytes { return r.charged(m.Holder()) + r.charged(mc.Holder()) }
			if got := ledger(); !within(got, p.AtStart()-p.Metadata) {
				t.Errorf("ledger at start %s, plan %s (less the metadata)", memreport.FormatBytes(got), memreport.FormatBytes(p.AtStart()-p.Metadata))
			}
			if !c.fill {
				return
			}
			seqs := max(1, c.o.Sequences)
			in := make([]SeqTokens, seqs)
			for i := range in {
				in[i] = SeqTokens{Seq: i, Tokens: prompt(i, c.o.NCtx, m.NVocab())}
			}
			if _, err := mc.DecodeBatch(bg(t), in); err != nil {
				t.Fatal(err)
			}
			if got := ledger(); !within(got, p.AtFull()-p.MetadataFull) {
				t.Errorf("ledger at full context %s, plan %s (less the metadata)", memreport.FormatBytes(got), memreport.FormatBytes(p.AtFull()-p.MetadataFull))
			}
			t.Logf("plan %s at start, %s at full; ledger %s at full; planned in %v", memreport.FormatBytes(p.AtStart()), memreport.FormatBytes(p.AtFull()), memreport.FormatBytes(ledger()), p.Took)
		})
	}
}

// TestPlanBadInput: a missing or corrupt model, an n_ctx beyond the
// trained context and a bad shape are typed errors.
func TestPlanBadInput(t *testing.T) {
	if _, err := PlanContext(t.TempDir()+"/none.gguf", PlanOptions{NCtx: 256}); !errors.Is(err, gguf.ErrMissing) {
		t.Errorf("a missing model: %v", err)
	}
	var le *LimitError
	if _, err := PlanContext(modelPath, PlanOptions{NCtx: 1 << 30}); !errors.As(err, &le) {
		t.Errorf("n_ctx 2^30: %v, want a *LimitError", err)
	}
	if _, err := PlanContext(modelPath, PlanOptions{NCtx: 300, Sequences: 2}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("two sequences of n_ctx 300: %v", err)
	}
}

// BenchmarkPlan times a plan of each model (n_ctx 4096, 8 sequences), with
// the large one when MEMGEN_LLAMACPP_LARGE_MODEL names it, against reading
// the same file's GGUF header and tensor table (gguf.Check) in the same
// run: ms/plan and the ratio vs-header-read.
func BenchmarkPlan(b *testing.B) {
	models := map[string]string{"tiny": modelPath, "gqa-f16": gqaModelPath, "gqa-q8_0": q8ModelPath}
	if large := os.Getenv("MEMGEN_LLAMACPP_LARGE_MODEL"); large != "" {
		models["large-f16"] = large
	}
	for _, name := range slices.Sorted(maps.Keys(models)) {
		path := models[name]
		b.Run(name, func(b *testing.B) {
			var plan, check time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := gguf.Check(path); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := PlanContext(path, PlanOptions{NCtx: 4096, Sequences: 8}); err != nil {
					b.Fatal(err)
				}
				check, plan = check+t1.Sub(t0), plan+time.Since(t1)
			}
			b.ReportMetric(float64(plan)/1e6/float64(b.N), "ms/plan")
			b.ReportMetric(float64(plan)/float64(check), "vs-header-read")
		})
	}
}

// TestCheckLedgerRefuses: a missing ledger is xproc's typed error; a
// ledger whose capacity is below the weights, and one that holds the
// weights but not the rest of the engine's start, are *xproc.FitErrors (matching
// memapi.ErrOverBudget) saying why; the ledger is left as it was: no slot
// taken, nothing claimed.
func TestCheckLedgerRefuses(t *testing.T) {
	dir := t.TempDir()
	o := PlanOptions{NCtx: 512}
	if _, _, err := CheckLedger(dir+"/none", modelPath, o); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing ledger: %v, want one matching fs.ErrNotExist", err)
	}
	p, err := PlanContext(modelPath, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		capacity memapi.Bytes
		reason   string
	}{
		{"below-the-weights", p.Weights / 2, "is below the weights alone"},
		{"below-the-start", p.Weights + 1<<20, "more than the ledger's capacity"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := dir + "/" + c.name
			l, err := xproc.Open(path, xproc.Options{Create: &xproc.CreateOptions{Capacity: uint64(c.capacity), Slots: 4}})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			_, f, err := CheckLedger(path, modelPath, o)
			var fe *xproc.FitError
			if !errors.As(err, &fe) || !errors.Is(err, memapi.ErrOverBudget) || f.Verdict != xproc.NeverFits || !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("%v (%+v), want an *xproc.FitError saying %q", err, f, c.reason)
			}
			h, slots, err := xproc.Inspect(path)
			if err != nil {
				t.Fatal(err)
			}
			if h.Claimed != 0 || h.Charged != 0 || h.Reserved != 0 {
				t.Errorf("after the refusal the ledger holds %+v", h)
			}
			for _, s := range slots {
				if s.PID != 0 {
					t.Errorf("after the refusal slot %d is taken by %d", s.Index, s.PID)
				}
			}
		})
	}
}
