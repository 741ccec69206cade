package llamacpp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memreport"
)

// The environment of the plan-rss child: the model, n_ctx per sequence
// and the sequences it loads stock llama.cpp with.
const (
	planModelEnv = "MEMGEN_PLAN_MODEL"
	planNCtxEnv  = "MEMGEN_PLAN_NCTX"
	planSeqsEnv  = "MEMGEN_PLAN_SEQS"
)

// planRSSChild measures what stock llama.cpp really takes: the peak
// resident set's growth from a defined baseline (the library loaded, the
// Go heap collected, the peak reset through /proc/self/clear_refs) to the
// end of a decode that fills every sequence's n_ctx (prompts decoded in
// batches: the compute buffers at their largest). It prints
// "plan-rss: growth=N".
func planRSSChild() int {
	fail := func(err error) int { fmt.Println("plan-rss:", err); return 3 }
	if err := Init(libPath); err != nil {
		return fail(err)
	}
	path := os.Getenv(planModelEnv)
	nCtx, err1 := strconv.Atoi(os.Getenv(planNCtxEnv))
	seqs, err2 := strconv.Atoi(os.Getenv(planSeqsEnv))
	if err1 != nil || err2 != nil {
		return fail(fmt.Errorf("bad %s or %s", planNCtxEnv, planSeqsEnv))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runtime.GC()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return fail(err)
	}
	base, err := statusField("VmRSS:")
	if err != nil {
		return fail(err)
	}
	m, err := LoadModel(ctx, path, Options{Stock: true})
	if err != nil {
		return fail(err)
	}
	defer m.Close(ctx)
	c, err := m.NewContext(ctx, ContextOptions{NCtx: nCtx, Sequences: seqs})
	if err != nil {
		return fail(err)
	}
	defer c.Close(ctx)
	in := make([]SeqTokens, seqs)
	for i := range in {
		in[i] = SeqTokens{Seq: i, Tokens: prompt(i, nCtx, m.NVocab())}
	}
	if _, err := c.DecodeBatch(ctx, in); err != nil {
		return fail(err)
	}
	peak, err := statusField("VmHWM:")
	if err != nil {
		return fail(err)
	}
	fmt.Printf("plan-rss: growth=%d\n", peak-base)
	return 0
}

// planRSS runs planRSSChild on the model and returns the growth.
func planRSS(t *testing.T, path string, nCtx, seqs int) memapi.Bytes {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=plan-rss", planModelEnv+"="+path,
		planNCtxEnv+"="+strconv.Itoa(nCtx), planSeqsEnv+"="+strconv.Itoa(seqs))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("plan-rss child: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "plan-rss: growth="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return memapi.Bytes(n)
		}
	}
	t.Fatalf("plan-rss child printed no growth:\n%s", out)
	return 0
}

// TestPlanMatchesRSS: what the plan says stock llama.cpp takes at full
// context (its buffers, its output buffer and its bookkeeping) is within
// max(2 %, 16 MiB) of the peak resident-set growth of a process that loads
// the model, makes the context and fills every sequence, for the tiny
// model, the GQA model in F16 and in Q8_0, and with
// MEMGEN_LLAMACPP_LARGE_MODEL set (scripts/llamacpp.sh plan writes it)
// the 1.1 GiB one. Without the race detector: its shadow memory grows
// with the process.
func TestPlanMatchesRSS(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's shadow memory grows the resident set")
	}
	cases := []struct {
		name, path string
		nCtx, seqs int
	}{
		{"tiny", modelPath, 1024, 2},
		{"gqa-f16", gqaModelPath, 512, 4},
		{"gqa-q8_0", q8ModelPath, 512, 4},
	}
	if large := os.Getenv("MEMGEN_LLAMACPP_LARGE_MODEL"); large != "" {
		cases = append(cases, struct {
			name, path string
			nCtx, seqs int
		}{"large-f16", large, 256, 1})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := PlanContext(c.path, PlanOptions{NCtx: c.nCtx, Sequences: c.seqs})
			if err != nil {
				t.Fatal(err)
			}
			growth := planRSS(t, c.path, c.nCtx, c.seqs)
			planned := p.Weights + p.KVFull + p.Compute + p.Output + p.MetadataFull
			errPct := 100 * (float64(planned) - float64(growth)) / float64(growth)
			t.Logf("planned %s (weights %s, KV %s, compute %s, output %s, bookkeeping %s), peak RSS growth %s: error %+.2f%% (planned in %v)",
				memreport.FormatBytes(planned), memreport.FormatBytes(p.Weights), memreport.FormatBytes(p.KVFull), memreport.FormatBytes(p.Compute),
				memreport.FormatBytes(p.Output), memreport.FormatBytes(p.MetadataFull), memreport.FormatBytes(growth), errPct, p.Took)
			if !within(planned, growth) {
				t.Errorf("planned %s, the process grew by %s: beyond max(2%%, 16 MiB)", memreport.FormatBytes(planned), memreport.FormatBytes(growth))
			}
		})
	}
}
