package ort

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/procmem"
	"github.com/memgen/memgen/memreport"
)

// planSeqs and planNCtx are the configuration the accuracy tests size:
// the many-engines scenario's static share (ONNX Runtime GenAI's buffer,
// 24 sequences of 1,024 tokens preallocated).
const planSeqs, planNCtx = 24, 1024

// TestPlanMatchesDecoder: the plan against what the engine charges, item
// by item, with a workspace Allocator and preallocated sequences: each
// sequence's KV cache is exactly KVPerSequence; the first steps take
// exactly Compute more from the workspace; the workspace holds the
// weights less those ONNX Runtime keeps in its own heap (reported); the
// totals within max(2 %, 16 MiB).
func TestPlanMatchesDecoder(t *testing.T) {
	needDecoder(t)
	p, err := PlanDecoder(decoderModel, PlanOptions{NCtx: planNCtx, Sequences: planSeqs, Mode: KVPreallocated})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, 1<<30, Options{})
	kv := newKVHost(t, 1<<30)
	d, err := NewDecoder(decoderModel, kv.bind, DecoderOptions{Mode: KVPreallocated, MaxSeq: planNCtx, Workspace: r.alloc})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	loaded := r.audit(t, "decoder loaded")
	var seqs []*Sequence
	defer func() {
		for _, q := range seqs {
			q.Close()
		}
	}()
	for range planSeqs {
		q, err := d.NewSequence(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, q)
		if _, err := q.Step(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
	}
	stepped := r.audit(t, "every sequence stepped")
	s, _ := kv.g.Authority(hostAuth)
	if s.Charged != p.KVFull || d.Tensors() != p.KVTensors || d.RowBytes()*memapi.Bytes(d.Tensors()) != p.KVPerToken {
		t.Errorf("KV: charged %d for %d sequences, planned %d (%d per sequence); tensors %d, planned %d", s.Charged, planSeqs, p.KVFull, p.KVPerSequence, d.Tensors(), p.KVTensors)
	}
	if got := stepped - loaded; got != p.Compute {
		t.Errorf("the steps took %d bytes more from the workspace, planned %d (activations at most %d)", got, p.Compute, p.Activations)
	}
	if loaded > p.Weights || loaded < p.Weights*4/5 {
		t.Errorf("the workspace holds %d bytes once loaded, the weights are %d", loaded, p.Weights)
	}
	engine := stepped + s.Charged
	if diff := absDiff(p.AtFull(), engine); diff > max(engine/50, 16<<20) {
		t.Errorf("planned %d at full, the engine charges %d", p.AtFull(), engine)
	}
	b := memreport.FormatBytes
	t.Logf("planned: weights %s, KV %s (%s a sequence), compute %s (activations at most %s): %s at full; charged: workspace %s once loaded (the weights less %s ONNX Runtime keeps itself), %s stepped, KV %s: %s (%+.1f %%)",
		b(p.Weights), b(p.KVFull), b(p.KVPerSequence), b(p.Compute), b(p.Activations), b(p.AtFull()),
		b(loaded), b(p.Weights-loaded), b(stepped), b(s.Charged), b(engine), 100*(float64(p.AtFull())-float64(engine))/float64(engine))
}

// TestPlanRoundsToGranules: with a context whose rows do not fill whole
// granules (1,000 rows of 256 bytes: 62.5 pages), each cache tensor of a
// preallocated sequence is charged in whole granules, as planned.
func TestPlanRoundsToGranules(t *testing.T) {
	needDecoder(t)
	const nCtx = 1000
	p, err := PlanDecoder(decoderModel, PlanOptions{NCtx: nCtx, Sequences: 2, Mode: KVPreallocated})
	if err != nil {
		t.Fatal(err)
	}
	kv := newKVHost(t, 1<<30)
	d, err := NewDecoder(decoderModel, kv.bind, DecoderOptions{Mode: KVPreallocated, MaxSeq: nCtx})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for range 2 {
		q, err := d.NewSequence(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
	}
	s, _ := kv.g.Authority(hostAuth)
	if s.Charged != p.KVFull || p.KVPerSequence == memapi.Bytes(nCtx)*p.KVPerToken {
		t.Errorf("two sequences of %d tokens charge %d, planned %d (%d a sequence, %d unrounded)", nCtx, s.Charged, p.KVFull, p.KVPerSequence, memapi.Bytes(nCtx)*p.KVPerToken)
	}
}

func absDiff(a, b memapi.Bytes) memapi.Bytes {
	if a > b {
		return a - b
	}
	return b - a
}

// TestPlanMatchesRSS: the plan's peak against the peak growth of a
// child process's resident set, from a baseline taken with ONNX Runtime
// loaded and warmed (WarmUp: its own start is not the model's), the Go
// heap collected and the high-water mark reset; the decoder is then
// loaded with a workspace Allocator and planSeqs preallocated sequences
// each step once. The planned peak is within max(2 %, 16 MiB) of the
// growth.
func TestPlanMatchesRSS(t *testing.T) {
	if os.Getenv("MEMGEN_ORT_PLAN_CHILD") != "" {
		if err := planChild(); err != nil {
			t.Fatal(err)
		}
		return
	}
	needDecoder(t)
	if raceEnabled {
		t.Skip("the race detector's shadow memory grows with the process: the resident set is not the engine's")
	}
	p, err := PlanDecoder(decoderModel, PlanOptions{NCtx: planNCtx, Sequences: planSeqs, Mode: KVPreallocated})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestPlanMatchesRSS$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "MEMGEN_ORT_PLAN_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var start, full memapi.Bytes
	i := bytes.Index(out, []byte("plan-child:"))
	if _, err := fmt.Sscanf(string(out[max(i, 0):]), "plan-child: start %d full %d", &start, &full); i < 0 || err != nil {
		t.Fatalf("child: no figures (%v) in\n%s", err, out)
	}
	b := memreport.FormatBytes
	for _, c := range []struct {
		what            string
		planned, growth memapi.Bytes
	}{
		{"loaded (the model's protobuf beside the weights)", p.AtStart() + p.Load, start},
		{fmt.Sprintf("%d sequences of %d tokens", planSeqs, planNCtx), p.Peak(), full},
	} {
		diff := absDiff(c.planned, c.growth)
		t.Logf("%s: planned %s, peak RSS growth %s (%+.1f %%, %s)", c.what, b(c.planned), b(c.growth), 100*(float64(c.planned)-float64(c.growth))/float64(c.growth), b(diff))
		if diff > max(c.growth/50, 16<<20) {
			t.Errorf("%s: planned %d, the resident set grew %d: more than max(2 %%, 16 MiB) apart", c.what, c.planned, c.growth)
		}
	}
}

// planChild is TestPlanMatchesRSS's process: it prints the peak growth
// once the decoder is loaded and once every sequence has stepped.
func planChild() error {
	if err := WarmUp(); err != nil {
		return err
	}
	ce, err := newChildEngine()
	if err != nil {
		return err
	}
	defer ce.close()
	base, err := procmem.Baseline()
	if err != nil {
		return err
	}
	d, err := NewDecoder(decoderModel, ce.kvBind, DecoderOptions{Mode: KVPreallocated, MaxSeq: planNCtx, Workspace: ce.alloc})
	if err != nil {
		return err
	}
	defer d.Close()
	loaded, err := procmem.Self()
	if err != nil {
		return err
	}
	for range planSeqs {
		q, err := d.NewSequence(context.Background())
		if err != nil {
			return err
		}
		defer q.Close()
		if _, err := q.Step(context.Background(), 1); err != nil {
			return err
		}
	}
	full, err := procmem.Self()
	if err != nil {
		return err
	}
	fmt.Printf("plan-child: start %d full %d\n", loaded.Peak-base.RSS, full.Peak-base.RSS)
	return nil
}

// TestPlanBadInput: a missing file, a file that is not a model, an
// initializer whose size overflows, a model without the decoder's
// interface, a context beyond the rotary cache, a
// mode a plan cannot size and a bad configuration are each typed errors.
func TestPlanBadInput(t *testing.T) {
	needDecoder(t)
	dir := t.TempDir()
	if _, err := PlanDecoder(dir+"/none.onnx", PlanOptions{NCtx: 64}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing model: %v", err)
	}
	junk := dir + "/junk.onnx"
	if err := os.WriteFile(junk, []byte("\xff\xff\xff\xff not a protobuf"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanDecoder(junk, PlanOptions{NCtx: 64}); err == nil {
		t.Errorf("a file that is not a model was planned")
	}
	// A hostile initializer: dimensions whose product overflows.
	init := protowire.AppendTag(nil, 1, protowire.VarintType)
	init = protowire.AppendVarint(init, 1<<40)
	init = protowire.AppendTag(init, 1, protowire.VarintType)
	init = protowire.AppendVarint(init, 1<<40)
	init = protowire.AppendTag(init, 2, protowire.VarintType)
	init = protowire.AppendVarint(init, elemFloat)
	graph := protowire.AppendBytes(protowire.AppendTag(nil, 5, protowire.BytesType), init)
	huge := dir + "/huge.onnx"
	if err := os.WriteFile(huge, protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType), graph), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanDecoder(huge, PlanOptions{NCtx: 64}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("an initializer of 2^80 elements: %v", err)
	}
	if _, err := PlanDecoder(smallModel, PlanOptions{NCtx: 64}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("a model that is no decoder: %v", err)
	}
	var le *LimitError
	if _, err := PlanDecoder(decoderModel, PlanOptions{NCtx: decMaxSeq + 1}); !errors.As(err, &le) || le.Field != "MaxSeq" {
		t.Errorf("NCtx beyond the rotary cache: %v", err)
	}
	if _, err := PlanDecoder(decoderModel, PlanOptions{NCtx: 64, Mode: KVConcat}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Errorf("KVConcat: %v", err)
	}
	for _, o := range []PlanOptions{{NCtx: 0}, {NCtx: 64, Sequences: -1}, {NCtx: 64, KVGranule: 3000}} {
		if _, err := PlanDecoder(decoderModel, o); !errors.Is(err, memapi.ErrInvalidSize) {
			t.Errorf("%+v: %v", o, err)
		}
	}
}
