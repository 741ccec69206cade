package ort

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ortgo "github.com/yalue/onnxruntime_go"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/memgen/memgen/generated/memapi"
)

// The exported layouts scripts/ort.sh builds (exported LAYOUT 2 256 4 2
// 4096 1024 1024): 2 layers, 4 query heads and 2 KV heads of size 64,
// rotary caches of 4,096 positions, vocabulary 1,024.
var (
	genaiMaskModel    = envOr("MEMGEN_ORT_GENAI_MASK_MODEL", cacheDir()+"/genai-mask-l2d256h4kv2p4096v1024.onnx")
	genaiSeqlensModel = envOr("MEMGEN_ORT_GENAI_SEQLENS_MODEL", cacheDir()+"/genai-seqlens-l2d256h4kv2p4096v1024.onnx")
	optimumModel      = envOr("MEMGEN_ORT_OPTIMUM_MODEL", cacheDir()+"/optimum-l2d256h4kv2p4096v1024.onnx")

	longDecode = flag.Bool("ort.long", false, "TestDecoderExportedLayouts decodes 2,048 tokens per layout (else 128)")
)

const (
	expLayers, expKVHeads, expHeadSize, expVocab = 2, 2, 64, 1024
	expTensors                                   = expLayers * 2
	expMaxSeq                                    = 2048
)

// expDims are an exported model's dimensions as scripts/ort.sh builds it
// (head size 64 in all): the test models' (tinyDims) and the benchmark-size
// GenAI decoder's (benchDims; genaiBenchModel).
type expDims struct{ layers, heads, kvHeads, vocab, rotary int }

var (
	tinyDims  = expDims{expLayers, 4, expKVHeads, expVocab, 4096}
	benchDims = expDims{4, 16, 4, 8192, 2048}
)

func (dm expDims) tensors() int { return dm.layers * 2 }

// needBenchModel skips (fails under CI=true or MEMGEN_ORT_REQUIRE=1) where
// the benchmark-size decoder is absent.
func needBenchModel(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(genaiBenchModel); err != nil {
		skipOrFail(t, "%v: run `make ort` to build the benchmark-size decoder", err)
	}
}

func needExported(t testing.TB) {
	t.Helper()
	for _, p := range []string{genaiMaskModel, genaiSeqlensModel, optimumModel} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: run `make ort` to build it", err)
		}
	}
}

// io is one declared input or output as the cited export has it: name,
// element type, dimensions (-1 symbolic) and their dim_param strings.
type io struct {
	name   string
	elem   int64
	dims   []int64
	params []string
}

// cache returns the declarations of the cache tensors: prefix.N.key and
// .value of every layer of dm, [batch_size, KV heads, rows, 64] with rows
// named rows.
func cache(dm expDims, prefix, rows string) []io {
	var out []io
	for l := range dm.layers {
		for _, kv := range []string{"key", "value"} {
			out = append(out, io{fmt.Sprintf("%s.%d.%s", prefix, l, kv), elemFloat, []int64{-1, int64(dm.kvHeads), -1, expHeadSize}, []string{"batch_size", "", rows, ""}})
		}
	}
	return out
}

// TestExportedLayoutsAsCited reads each model scripts/ort.sh writes in an
// exported layout and checks it against the export the script cites:
// the inputs' and outputs' names, element types, shapes and dim_param
// strings in order; for GenAI's, one GroupQueryAttention node per layer
// over packed QKV with the builder's inputs, outputs and attributes
// (num_heads 4, kv_num_heads 2 in the test models, 16 and 4 in the
// benchmark-size decoder; scale 1/8, do_rotary 1, rotary_interleaved 0)
// and rotary caches of the model's positions, and, with attention_mask, seqlens_k and total_sequence_length
// computed from it as the builder does; for Optimum's, each present made
// by a Concat of its past on the sequence axis and no GroupQueryAttention.
// Each reads as its Layout.
func TestExportedLayoutsAsCited(t *testing.T) {
	needExported(t)
	logits := func(dm expDims) io {
		return io{"logits", elemFloat, []int64{-1, -1, int64(dm.vocab)}, []string{"batch_size", "sequence_length", ""}}
	}
	ids := io{"input_ids", elemInt64, []int64{-1, -1}, []string{"batch_size", "sequence_length"}}
	mask := io{"attention_mask", elemInt64, []int64{-1, -1}, []string{"batch_size", "total_sequence_length"}}
	for _, c := range []struct {
		path     string
		layout   Layout
		dm       expDims
		ins      []io
		outs     []io
		fromMask bool
	}{
		{genaiMaskModel, LayoutGenAI, tinyDims,
			append([]io{ids, mask}, cache(tinyDims, "past_key_values", "past_sequence_length")...),
			append([]io{logits(tinyDims)}, cache(tinyDims, "present", "total_sequence_length")...), true},
		{genaiSeqlensModel, LayoutGenAI, tinyDims,
			append([]io{ids, {"seqlens_k", elemInt32, []int64{-1}, []string{"batch_size"}}, {"total_sequence_length", elemInt32, []int64{1}, []string{""}}}, cache(tinyDims, "past_key_values", "past_sequence_length")...),
			append([]io{logits(tinyDims)}, cache(tinyDims, "present", "total_sequence_length")...), false},
		{optimumModel, LayoutOptimum, tinyDims,
			append([]io{ids, {"attention_mask", elemInt64, []int64{-1, -1}, []string{"batch_size", "past_sequence_length + sequence_length"}},
				{"position_ids", elemInt64, []int64{-1, -1}, []string{"batch_size", "sequence_length"}}}, cache(tinyDims, "past_key_values", "past_sequence_length")...),
			append([]io{logits(tinyDims)}, cache(tinyDims, "present", "past_sequence_length + 1")...), false},
		{genaiBenchModel, LayoutGenAI, benchDims,
			append([]io{ids, mask}, cache(benchDims, "past_key_values", "past_sequence_length")...),
			append([]io{logits(benchDims)}, cache(benchDims, "present", "total_sequence_length")...), true},
	} {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			if c.path == genaiBenchModel {
				needBenchModel(t)
			}
			dm := c.dm
			g, err := readGraph(c.path)
			if err != nil {
				t.Fatal(err)
			}
			for _, side := range []struct {
				what      string
				got, want []valueInfo
			}{{"inputs", declaredInputs(g), toInfos(c.ins)}, {"outputs", g.outputs, toInfos(c.outs)}} {
				if len(side.got) != len(side.want) {
					t.Fatalf("%d %s, want %d", len(side.got), side.what, len(side.want))
				}
				for i, w := range side.want {
					v := side.got[i]
					if v.name != w.name || v.elem != w.elem || !slices.Equal(v.dims, w.dims) || !slices.Equal(v.params, w.params) {
						t.Errorf("%s %d: %s elem %d dims %v %q; want %s elem %d dims %v %q", side.what, i, v.name, v.elem, v.dims, v.params, w.name, w.elem, w.dims, w.params)
					}
				}
			}
			producer := map[string]*node{}
			gqa, concats := 0, 0
			for k := range g.nodes {
				n := &g.nodes[k]
				for _, o := range n.outs {
					producer[o] = n
				}
				if n.op == "GroupQueryAttention" {
					gqa++
				}
			}
			for l := range dm.layers {
				pk, pv := fmt.Sprintf("past_key_values.%d.key", l), fmt.Sprintf("past_key_values.%d.value", l)
				ck, cv := fmt.Sprintf("present.%d.key", l), fmt.Sprintf("present.%d.value", l)
				if c.layout == LayoutOptimum {
					for _, pc := range [][2]string{{pk, ck}, {pv, cv}} {
						n := producer[pc[1]]
						if n == nil || n.op != "Concat" || n.ints["axis"] != 2 || len(n.inputs) != 2 || n.inputs[0] != pc[0] {
							t.Errorf("%s is not Concat(%s, new, axis=2): %+v", pc[1], pc[0], n)
						}
						concats++
					}
					continue
				}
				n := producer[ck]
				want := []string{"", "", pk, pv, "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"}
				if n == nil || n.op != "GroupQueryAttention" || n.domain != "com.microsoft" || len(n.inputs) != 9 || !slices.Equal(n.inputs[1:], want) ||
					len(n.outs) != 3 || n.outs[1] != ck || n.outs[2] != cv {
					t.Fatalf("layer %d: %s is not made by GroupQueryAttention(qkv, %q) → (out, %s, %s): %+v", l, ck, want, ck, cv, n)
				}
				attrs := map[string]int64{"num_heads": int64(dm.heads), "kv_num_heads": int64(dm.kvHeads), "do_rotary": 1, "rotary_interleaved": 0}
				for k, v := range attrs {
					if got, ok := n.ints[k]; !ok || got != v {
						t.Errorf("layer %d: GroupQueryAttention %s = %d (set %v), want %d", l, k, got, ok, v)
					}
				}
				if s := n.floats["scale"]; s != float32(1/math.Sqrt(expHeadSize)) {
					t.Errorf("layer %d: scale %g, want 1/sqrt(64)", l, s)
				}
				if cos := g.dims["cos_cache"]; !slices.Equal(cos, []int64{int64(dm.rotary), expHeadSize / 2}) {
					t.Errorf("cos_cache %v, want [%d 32]", cos, dm.rotary)
				}
			}
			if c.layout == LayoutOptimum && (gqa != 0 || concats != dm.tensors()) {
				t.Errorf("Optimum's export: %d GroupQueryAttention nodes, %d present Concats; want 0 and %d", gqa, concats, dm.tensors())
			}
			if c.layout == LayoutGenAI && gqa != dm.layers {
				t.Errorf("GenAI's export: %d GroupQueryAttention nodes, want one per layer (%d)", gqa, dm.layers)
			}
			if c.fromMask {
				// make_attention_mask_reformatting_for_gqa: seqlens_k =
				// Cast<int32>(ReduceSum(attention_mask) - 1),
				// total_sequence_length = Cast<int32>(Gather(Shape(attention_mask), 1)).
				chain := func(out string, ops ...string) {
					n := producer[out]
					for i, op := range ops {
						if n == nil || n.op != op {
							t.Fatalf("%s: want the chain %v from attention_mask, step %d is %+v", out, ops, i, n)
						}
						if i == 0 && n.ints["to"] != elemInt32 {
							t.Errorf("%s: Cast to %d, want int32", out, n.ints["to"])
						}
						if i == len(ops)-1 {
							if n.inputs[0] != "attention_mask" {
								t.Errorf("%s: the chain starts at %s, want attention_mask", out, n.inputs[0])
							}
							break
						}
						n = producer[n.inputs[0]]
					}
				}
				chain("seqlens_k", "Cast", "Sub", "ReduceSum")
				chain("total_sequence_length", "Cast", "Gather", "Shape")
			}
			l, err := readLayout(declaredInputs(g), g.outputs, g, expMaxSeq)
			if err != nil {
				t.Fatal(err)
			}
			if l.layout != c.layout || l.kvHeads != dm.kvHeads || l.headSize != expHeadSize || len(l.slots) != dm.tensors() || l.vocab != dm.vocab {
				t.Fatalf("read as %v, %d KV heads of %d, %d cache tensors, vocabulary %d; want %v, %d of %d, %d, %d",
					l.layout, l.kvHeads, l.headSize, len(l.slots), l.vocab, c.layout, dm.kvHeads, expHeadSize, dm.tensors(), dm.vocab)
			}
		})
	}
	g, err := readGraph(decoderModel)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := readLayout(declaredInputs(g), g.outputs, g, 0); err != nil || l.layout != LayoutPerHead || l.kvHeads != 1 {
		t.Fatalf("memgen's own decoder: %v, %v; want the per-head layout", l, err)
	}
}

func toInfos(x []io) []valueInfo {
	out := make([]valueInfo, len(x))
	for i, v := range x {
		out[i] = valueInfo(v)
	}
	return out
}

// refRun is ONNX Runtime's own decoding of an exported model, through
// onnxruntime_go, fed the way its tool feeds it: GenAI's share buffer
// preallocated at the maximum length and bound as past and present, a
// growing attention_mask (or seqlens_k and total_sequence_length);
// Optimum's presents fed back as the next step's pasts.
type refRun struct {
	s      *ortgo.DynamicAdvancedSession
	layout Layout
	ins    []string
	outs   []string
	pasts  []ortgo.Value // by cache tensor, in the model's order
	logits *ortgo.Tensor[float32]
	vocab  int
	pos    int
}

func newRefRun(t *testing.T, path string, layout Layout) *refRun {
	t.Helper()
	g, err := readGraph(path)
	if err != nil {
		t.Fatal(err)
	}
	r := &refRun{layout: layout, vocab: int(g.outputs[0].dims[2])}
	var pastDims [][]int64
	for _, in := range declaredInputs(g) {
		r.ins = append(r.ins, in.name)
		if strings.HasPrefix(in.name, pkvPrefix) {
			pastDims = append(pastDims, in.dims) // [batch_size, KV heads, rows, head size]
		}
	}
	for _, o := range g.outputs {
		r.outs = append(r.outs, o.name)
	}
	opts, err := ortgo.NewSessionOptions()
	if err != nil {
		t.Fatal(err)
	}
	defer opts.Destroy()
	if err := opts.SetIntraOpNumThreads(1); err != nil {
		t.Fatal(err)
	}
	if r.s, err = ortgo.NewDynamicAdvancedSession(path, r.ins, r.outs, opts); err != nil {
		t.Fatal(err)
	}
	if r.logits, err = ortgo.NewEmptyTensor[float32](ortgo.NewShape(1, 1, int64(r.vocab))); err != nil {
		t.Fatal(err)
	}
	for _, dims := range pastDims {
		rows := int64(0) // Optimum: an empty past
		if layout == LayoutGenAI {
			rows = expMaxSeq // GenAI: max_length, preallocated
		}
		v, err := ortgo.NewEmptyTensor[float32](ortgo.NewShape(1, dims[1], rows, dims[3]))
		if err != nil {
			t.Fatal(err)
		}
		r.pasts = append(r.pasts, v)
	}
	t.Cleanup(func() {
		for _, v := range r.pasts {
			v.Destroy()
		}
		r.logits.Destroy()
		r.s.Destroy()
	})
	return r
}

// step runs token and returns the logits.
func (r *refRun) step(t *testing.T, token int64) []float32 {
	t.Helper()
	return r.run(t, []int64{token})
}

// run runs tokens in one Run, fed as the tool feeds a prompt (input_ids
// and position_ids [1, n], attention_mask [1, past + n], seqlens_k
// past + n - 1, total_sequence_length past + n), and returns the last
// token's logits; ONNX Runtime allocates the logits of several tokens.
func (r *refRun) run(t *testing.T, tokens []int64) []float32 {
	t.Helper()
	n := len(tokens)
	var tmp []ortgo.Value
	defer func() {
		for _, v := range tmp {
			v.Destroy()
		}
	}()
	mk := func(v ortgo.Value, err error) ortgo.Value {
		if err != nil {
			t.Fatal(err)
		}
		tmp = append(tmp, v)
		return v
	}
	total := r.pos + n
	ins := make([]ortgo.Value, len(r.ins))
	k := 0
	for i, name := range r.ins {
		switch name {
		case inIDs:
			ins[i] = mk(ortgo.NewTensor(ortgo.NewShape(1, int64(n)), slices.Clone(tokens)))
		case inPos:
			pos := make([]int64, n)
			for j := range pos {
				pos[j] = int64(r.pos + j)
			}
			ins[i] = mk(ortgo.NewTensor(ortgo.NewShape(1, int64(n)), pos))
		case inMask:
			mask := make([]int64, total)
			for j := range mask {
				mask[j] = 1
			}
			ins[i] = mk(ortgo.NewTensor(ortgo.NewShape(1, int64(total)), mask))
		case inSeqlens:
			ins[i] = mk(ortgo.NewTensor(ortgo.NewShape(1), []int32{int32(total - 1)}))
		case inTotal:
			ins[i] = mk(ortgo.NewTensor(ortgo.NewShape(1), []int32{int32(total)}))
		default:
			ins[i] = r.pasts[k]
			k++
		}
	}
	outs := make([]ortgo.Value, len(r.outs))
	if n == 1 {
		outs[0] = r.logits
	}
	if r.layout == LayoutGenAI {
		copy(outs[1:], r.pasts) // the share buffer: present is past
	}
	if err := r.s.Run(ins, outs); err != nil {
		t.Fatalf("reference run at %d: %v", r.pos, err)
	}
	if r.layout == LayoutOptimum {
		for i := range r.pasts {
			r.pasts[i].Destroy()
			r.pasts[i] = outs[1+i] // the present is the next past
		}
	}
	r.pos = total
	if n == 1 {
		return r.logits.GetData()
	}
	lv := outs[0].(*ortgo.Tensor[float32])
	defer lv.Destroy()
	all := lv.GetData()
	if len(all) != n*r.vocab {
		t.Fatalf("reference run: %d logits, want %d × %d", len(all), n, r.vocab)
	}
	return slices.Clone(all[(n-1)*r.vocab:])
}

// TestDecoderExportedLayouts decodes each exported layout as it comes,
// with no change to the model, through memgen's Decoder in lockstep with
// ONNX Runtime's own run of the same file (refRun): GenAI's share buffer
// with attention_mask in KVGrow and KVPreallocated, with seqlens_k and
// total_sequence_length in KVGrow, Optimum's concat in KVConcat. A prompt
// of 17 tokens fed one per step, then greedy tokens: 128 steps in all,
// 2,048 with -ort.long. The prefill cases run a prompt of 300 tokens through
// Sequence.Prefill, in one Run or in Runs of 64 (64, 64, 64, 64, 44), and
// ONNX Runtime's own run is fed the same Runs; then 128 greedy steps
// (with -ort.long, to 2,048 tokens), beside a second sequence of the same mode (its
// own host) fed the prompt one token per Step. The benchmark-size GenAI
// decoder (genaiBenchModel: 4 layers, 4 KV heads, vocabulary 8,192) runs
// the KVGrow cases with attention_mask, token by token and prefilled in one
// Run, where it is present. After the prompt and every step:
//   - the tokens are equal to ONNX Runtime's, and the largest logit
//     difference is 0; a prefilled sequence's tokens are equal to the
//     token-by-token one's too (their logits differ by float rounding: the
//     attention of several query rows sums in another order; logged);
//   - KVGrow: each layer's cache is one Region of 2 KV heads × 2,048
//     rows bound once, as past and present; the ledger, the mechanism and
//     mincore all equal each head's rows × 256 bytes rounded up to the
//     4 KiB granule, × 2 heads × 4 tensors (4 heads × 8 tensors in the
//     benchmark-size decoder; after a Prefill, the prompt's rows: one
//     growth); KVPreallocated: the 4 Buffers of 2 heads × 2,048 rows,
//     from the start;
//   - tensors: no OrtValue made during a step but the attention_mask's
//     header where the model has one; a Prefill makes per Run of several
//     tokens the input_ids' and position_ids' headers and the mask's.
//
// After Close every host is at 0.
func TestDecoderExportedLayouts(t *testing.T) {
	needExported(t)
	decode := 128
	if *longDecode {
		decode = 2048
	}
	for _, c := range []struct {
		path    string
		layout  Layout
		mode    KVMode
		prefill bool
		chunk   int
		dm      expDims
	}{
		{genaiMaskModel, LayoutGenAI, KVGrow, false, 0, tinyDims},
		{genaiMaskModel, LayoutGenAI, KVPreallocated, false, 0, tinyDims},
		{genaiSeqlensModel, LayoutGenAI, KVGrow, false, 0, tinyDims},
		{optimumModel, LayoutOptimum, KVConcat, false, 0, tinyDims},
		{genaiMaskModel, LayoutGenAI, KVGrow, true, 0, tinyDims},
		{genaiMaskModel, LayoutGenAI, KVGrow, true, 64, tinyDims},
		{genaiMaskModel, LayoutGenAI, KVPreallocated, true, 0, tinyDims},
		{genaiSeqlensModel, LayoutGenAI, KVGrow, true, 64, tinyDims},
		{optimumModel, LayoutOptimum, KVConcat, true, 0, tinyDims},
		{optimumModel, LayoutOptimum, KVConcat, true, 64, tinyDims},
		{genaiBenchModel, LayoutGenAI, KVGrow, false, 0, benchDims},
		{genaiBenchModel, LayoutGenAI, KVGrow, true, 0, benchDims},
	} {
		name := fmt.Sprintf("%s/%v", filepath.Base(c.path), c.mode)
		promptLen := 17
		if c.prefill {
			name += fmt.Sprintf("/prefill-chunk-%d", c.chunk)
			promptLen = 300
		}
		t.Run(name, func(t *testing.T) {
			if c.path == genaiBenchModel {
				needBenchModel(t)
			}
			dm := c.dm
			h := newKVHost(t, 64<<20)
			bind := h.bind
			if c.mode == KVConcat {
				bind = nil
			}
			opts := DecoderOptions{Mode: c.mode, MaxSeq: expMaxSeq, PrefillChunk: c.chunk}
			d, err := NewDecoder(c.path, bind, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if d.Layout() != c.layout || d.KVHeads() != dm.kvHeads || d.Tensors() != dm.tensors() || d.Vocab() != dm.vocab || d.PrefillChunk() != c.chunk {
				t.Fatalf("read as %v, %d KV heads, %d tensors, vocabulary %d, chunk %d", d.Layout(), d.KVHeads(), d.Tensors(), d.Vocab(), d.PrefillChunk())
			}
			q, err := d.NewSequence(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			// The token-by-token sequence beside a prefilled one.
			var byToken *Sequence
			if c.prefill {
				h1 := newKVHost(t, 64<<20)
				bind1 := h1.bind
				if c.mode == KVConcat {
					bind1 = nil
				}
				d1, err := NewDecoder(c.path, bind1, DecoderOptions{Mode: c.mode, MaxSeq: expMaxSeq})
				if err != nil {
					t.Fatal(err)
				}
				defer d1.Close()
				if byToken, err = d1.NewSequence(context.Background()); err != nil {
					t.Fatal(err)
				}
				defer byToken.Close()
			}
			ref := newRefRun(t, c.path, c.layout)
			b0, err := q.bindings()
			if err != nil {
				t.Fatal(err)
			}
			perMask := int64(0)
			if d.mask >= 0 {
				perMask = 1
			}
			perPos := int64(0)
			if d.pos >= 0 {
				perPos = 1
			}
			prompt := make([]int64, promptLen)
			prompt[0] = 1
			for i := 1; i < promptLen; i++ {
				prompt[i] = int64((i-1)*37+5) % expVocab
			}
			preBytes := memapi.Bytes(dm.tensors() * dm.kvHeads * expMaxSeq * 256)
			ctx := context.Background()
			var diff, diffByToken float64
			var tok int64
			steps := decode
			if c.prefill {
				steps = min(promptLen+decode, expMaxSeq) // the prompt and its greedy tokens within MaxSeq
			}
			for i := range steps {
				values := valuesMade()
				var got, want []float32
				switch {
				case c.prefill && i < promptLen-1:
					continue // the prompt runs at once at its last token
				case c.prefill && i == promptLen-1:
					got, err = q.Prefill(ctx, prompt)
					if err != nil {
						t.Fatalf("prefill: %v", err)
					}
					var runs, made int64
					for off := 0; off < promptLen; off += cmp.Or(c.chunk, promptLen) {
						runs++
						if m := min(promptLen-off, cmp.Or(c.chunk, promptLen)); m > 1 {
							made += 1 + perPos
						}
					}
					if n := valuesMade() - values; n != made+runs*perMask {
						t.Fatalf("prefill: %d OrtValues made, want %d (%d Runs)", n, made+runs*perMask, runs)
					}
					for off := 0; off < promptLen; off += cmp.Or(c.chunk, promptLen) {
						want = ref.run(t, prompt[off:min(off+cmp.Or(c.chunk, promptLen), promptLen)])
					}
					var last []float32
					for _, p := range prompt {
						if last, err = byToken.Step(ctx, p); err != nil {
							t.Fatal(err)
						}
					}
					diffByToken = max(diffByToken, maxDiff(got, last))
					if argmax(got) != argmax(last) {
						t.Fatalf("after the prompt: next token %d prefilled, %d token by token (max |logit difference| %g)", argmax(got), argmax(last), maxDiff(got, last))
					}
				default:
					if i < promptLen {
						tok = prompt[i]
					}
					got, err = q.Step(ctx, tok)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if n := valuesMade() - values; n != perMask {
						t.Fatalf("step %d: %d OrtValues made, want %d", i, n, perMask)
					}
					want = ref.step(t, tok)
					if byToken != nil {
						last, err := byToken.Step(ctx, tok)
						if err != nil {
							t.Fatal(err)
						}
						diffByToken = max(diffByToken, maxDiff(got, last))
						if argmax(got) != argmax(last) {
							t.Fatalf("step %d: next token %d after a prefilled prompt, %d token by token (max |logit difference| %g)", i, argmax(got), argmax(last), maxDiff(got, last))
						}
					}
				}
				diff = max(diff, maxDiff(got, want))
				next, refNext := argmax(got), argmax(want)
				if next != refNext {
					t.Fatalf("step %d: next token %d through the Decoder, %d through ONNX Runtime's own run (max |logit difference| %g)", i, next, refNext, maxDiff(got, want))
				}
				tok = next
				switch c.mode {
				case KVGrow:
					per, _ := memapi.RoundUp(memapi.Bytes(i+1)*256, kvGranule)
					want := per * memapi.Bytes(dm.kvHeads*dm.tensors())
					if n, b := h.charged(t, fmt.Sprintf("step %d", i)), q.Stats().Backed; n != want || b != want {
						t.Fatalf("step %d (%d tokens): charged %d, backed %d; want %d (each KV head's rows in whole granules)", i, i+1, n, b, want)
					}
				case KVPreallocated:
					if n := h.charged(t, fmt.Sprintf("step %d", i)); n != preBytes {
						t.Fatalf("step %d: charged %d, want %d", i, n, preBytes)
					}
				}
				if st := q.Stats(); st.Tokens != i+1 {
					t.Fatalf("step %d: %d tokens, want %d", i, st.Tokens, i+1)
				}
				if c.mode != KVConcat {
					now, err := q.bindings()
					if err != nil {
						t.Fatal(err)
					}
					for j := range now {
						if now[j] != b0[j] || now[j].past != now[j].present || now[j].data != uintptr(now[j].mem) {
							t.Fatalf("step %d: cache tensor %d bound as %+v, was %+v", i, j, now[j], b0[j])
						}
					}
				}
			}
			if diff != 0 {
				t.Errorf("the logits differ from ONNX Runtime's own run by up to %g", diff)
			}
			st := q.Stats()
			t.Logf("%v, %v: %d tokens (prompt %d, prefilled %v in Runs of %d), the same greedy tokens as ONNX Runtime's own run, max |logit difference| %g; token by token: the same tokens, max |logit difference| %g; %d bytes backed, %d present bytes copied by the concat",
				c.layout, c.mode, steps, promptLen, c.prefill, cmp.Or(c.chunk, promptLen), diff, diffByToken, st.Backed, st.PresentBytes)
			if err := q.Close(); err != nil {
				t.Fatal(err)
			}
			if n := h.charged(t, "closed"); n != 0 {
				t.Fatalf("charged %d after Close", n)
			}
		})
	}
}

// Bad layouts, made by editing the GenAI and Optimum models' declared
// inputs and outputs (ValueInfoProto: name 1, type 2; TypeProto
// tensor_type 1; elem_type 1, shape 2; TensorShapeProto dim 1).

// editIO returns the model at path with f applied to each declared input
// (out false) and output; f returns the new ValueInfoProto, or nil to drop
// it. extra ValueInfoProtos are appended to the outputs.
func editIO(t *testing.T, path, name string, f func(out bool, vi []byte) []byte, extra ...[]byte) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = rewrite(b, 7, func(_ int, gb []byte) []byte {
		var g []byte
		for len(gb) > 0 {
			n, typ, l := protowire.ConsumeTag(gb)
			m := protowire.ConsumeFieldValue(n, typ, gb[l:])
			field := gb[:l+m]
			if (n == 11 || n == 12) && typ == protowire.BytesType {
				v, _ := protowire.ConsumeBytes(gb[l:])
				if nv := f(n == 12, v); nv != nil {
					g = protowire.AppendBytes(protowire.AppendTag(g, n, protowire.BytesType), nv)
				}
			} else {
				g = append(g, field...)
			}
			gb = gb[l+m:]
		}
		for _, x := range extra {
			g = protowire.AppendBytes(protowire.AppendTag(g, 12, protowire.BytesType), x)
		}
		return g
	})
	p := filepath.Join(t.TempDir(), name+".onnx")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tensorType rewrites a ValueInfoProto's tensor type with f.
func tensorType(vi []byte, f func(tt []byte) []byte) []byte {
	return rewrite(vi, 2, func(_ int, tp []byte) []byte { return rewrite(tp, 1, func(_ int, tt []byte) []byte { return f(tt) }) })
}

// withElem sets a tensor type's elem_type.
func withElem(tt []byte, elem uint64) []byte {
	var out []byte
	for len(tt) > 0 {
		n, typ, l := protowire.ConsumeTag(tt)
		m := protowire.ConsumeFieldValue(n, typ, tt[l:])
		if n != 1 || typ != protowire.VarintType {
			out = append(out, tt[:l+m]...)
		}
		tt = tt[l+m:]
	}
	return protowire.AppendVarint(protowire.AppendTag(out, 1, protowire.VarintType), elem)
}

// withRank keeps a tensor type's first rank dimensions.
func withRank(tt []byte, rank int) []byte {
	return rewrite(tt, 2, func(_ int, sh []byte) []byte {
		var out []byte
		k := 0
		for len(sh) > 0 {
			n, typ, l := protowire.ConsumeTag(sh)
			m := protowire.ConsumeFieldValue(n, typ, sh[l:])
			if n != 1 || k < rank {
				out = append(out, sh[:l+m]...)
			}
			if n == 1 {
				k++
			}
			sh = sh[l+m:]
		}
		return out
	})
}

// withName renames a ValueInfoProto.
func withName(vi []byte, to string) []byte {
	return rewrite(vi, 1, func(int, []byte) []byte { return []byte(to) })
}

// TestDecoderLayoutErrors: exports of no layout are refused by NewDecoder
// and PlanDecoder, before ONNX Runtime loads the model and before any
// byte is committed, with a *LayoutError (matching memapi.ErrUnsupported)
// naming the input or output at fault; and Optimum's concat layout in a
// mode that binds the cache is memapi.ErrUnsupported.
func TestDecoderLayoutErrors(t *testing.T) {
	needExported(t)
	h := newKVHost(t, 64<<20)
	var present0 []byte // present.0.key's declaration, for an output of no past
	editIO(t, genaiMaskModel, "probe", func(out bool, vi []byte) []byte {
		if out && name(vi) == "present.0.key" {
			present0 = slices.Clone(vi)
		}
		return vi
	})
	only := func(target string, f func([]byte) []byte) func(bool, []byte) []byte {
		return func(_ bool, vi []byte) []byte {
			if name(vi) == target {
				return f(vi)
			}
			return vi
		}
	}
	for _, c := range []struct {
		what, model, fault string
		edit               func(bool, []byte) []byte
		extra              [][]byte
	}{
		{"missing present", genaiMaskModel, "input past_key_values.1.value",
			func(out bool, vi []byte) []byte {
				if out && name(vi) == "present.1.value" {
					return nil
				}
				return vi
			}, nil},
		{"a past without present (renamed)", optimumModel, "input past_key_values.0.key",
			only("present.0.key", func(vi []byte) []byte { return withName(vi, "present.0.keys") }), nil},
		{"a present without past", genaiMaskModel, "output present.9.key", func(_ bool, vi []byte) []byte { return vi }, nil},
		{"wrong rank", genaiMaskModel, "input past_key_values.0.key",
			only("past_key_values.0.key", func(vi []byte) []byte {
				return tensorType(vi, func(tt []byte) []byte { return withRank(tt, 3) })
			}), nil},
		{"wrong dtype of the cache", optimumModel, "input past_key_values.1.key",
			only("past_key_values.1.key", func(vi []byte) []byte {
				return tensorType(vi, func(tt []byte) []byte { return withElem(tt, elemFloat16) })
			}), nil},
		{"wrong dtype of the mask", genaiMaskModel, "input attention_mask",
			only("attention_mask", func(vi []byte) []byte {
				return tensorType(vi, func(tt []byte) []byte { return withElem(tt, elemInt32) })
			}), nil},
		{"mixed layouts (names)", genaiMaskModel, "input past_key.1.0",
			only("past_key_values.1.key", func(vi []byte) []byte { return withName(vi, "past_key.1.0") }), nil},
		{"no mask, no lengths", genaiMaskModel, "input attention_mask",
			func(out bool, vi []byte) []byte {
				if !out && name(vi) == "attention_mask" {
					return nil
				}
				return vi
			}, nil},
		{"an unknown input", optimumModel, "input token_type_ids",
			only("position_ids", func(vi []byte) []byte { return withName(vi, "token_type_ids") }), nil},
	} {
		t.Run(c.what, func(t *testing.T) {
			extra := c.extra
			if c.what == "a present without past" {
				extra = [][]byte{withName(present0, "present.9.key")}
			}
			p := editIO(t, c.model, "bad", c.edit, extra...)
			var le *LayoutError
			_, err := NewDecoder(p, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 64})
			if !errors.As(err, &le) || !errors.Is(err, memapi.ErrUnsupported) || le.Name != c.fault {
				t.Fatalf("NewDecoder: %v; want a *LayoutError naming %s", err, c.fault)
			}
			t.Log(err)
			if _, err := PlanDecoder(p, PlanOptions{NCtx: 64}); !errors.As(err, &le) || le.Name != c.fault {
				t.Fatalf("PlanDecoder: %v; want a *LayoutError naming %s", err, c.fault)
			}
		})
	}
	// Mixed attention: one layer's cache read by GroupQueryAttention, the
	// other's concatenated. Made from the GenAI model by renaming layer
	// 1's GroupQueryAttention op (its past and present then belong to no
	// such node).
	b, err := os.ReadFile(genaiMaskModel)
	if err != nil {
		t.Fatal(err)
	}
	b = rewrite(b, 7, func(_ int, g []byte) []byte {
		return rewrite(g, 1, func(_ int, nb []byte) []byte {
			isLayer1 := false
			_ = fields(nb, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
				if num == 1 && string(v) == "past_key_values.1.key" {
					isLayer1 = true
				}
				return nil
			})
			if !isLayer1 {
				return nb
			}
			return rewrite(nb, 4, func(int, []byte) []byte { return []byte("GroupQueryAttentionX") })
		})
	})
	mixed := filepath.Join(t.TempDir(), "mixed.onnx")
	if err := os.WriteFile(mixed, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var le *LayoutError
	if _, err := NewDecoder(mixed, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 64}); !errors.As(err, &le) || le.Name != "input past_key_values.1.key" {
		t.Fatalf("mixed GroupQueryAttention and concat: %v; want a *LayoutError naming past_key_values.1.key", err)
	} else {
		t.Log(err)
	}
	for _, mode := range []KVMode{KVGrow, KVPreallocated} {
		if _, err := NewDecoder(optimumModel, h.bind, DecoderOptions{Mode: mode, MaxSeq: 64}); !errors.Is(err, memapi.ErrUnsupported) || errors.As(err, &le) {
			t.Fatalf("Optimum's concat layout in %v: %v; want memapi.ErrUnsupported (KVConcat only)", mode, err)
		}
	}
	if _, err := PlanDecoder(optimumModel, PlanOptions{NCtx: 64}); !errors.Is(err, memapi.ErrUnsupported) {
		t.Fatalf("a plan of Optimum's concat layout: %v; want memapi.ErrUnsupported", err)
	}
	if n := h.charged(t, "after the refusals"); n != 0 {
		t.Fatalf("charged %d after the refusals", n)
	}
}

// TestPlanExportedLayouts: the plan of GenAI's layout against what the
// engine charges: two preallocated sequences of 1,000 tokens (each layer's
// Buffer of 2 heads × 1,000 rows in whole granules) and one KVGrow
// sequence stepped to 100 tokens (each head's 100 rows in whole granules),
// each exactly KVFull; KVPerToken is the tensors × KV heads × RowBytes.
func TestPlanExportedLayouts(t *testing.T) {
	needExported(t)
	for _, path := range []string{genaiMaskModel, genaiSeqlensModel} {
		for _, c := range []struct {
			mode        KVMode
			nCtx, seqs  int
			steps       int
			wantPerSeq  memapi.Bytes
			wantRounded bool
		}{
			{KVPreallocated, 1000, 2, 1, expTensors * memapi.Bytes((expKVHeads*1000*256+4095)/4096*4096), true},
			{KVGrow, 100, 1, 100, expTensors * expKVHeads * memapi.Bytes((100*256+4095)/4096*4096), true},
		} {
			p, err := PlanDecoder(path, PlanOptions{NCtx: c.nCtx, Sequences: c.seqs, Mode: c.mode})
			if err != nil {
				t.Fatal(err)
			}
			kv := newKVHost(t, 1<<30)
			d, err := NewDecoder(path, kv.bind, DecoderOptions{Mode: c.mode, MaxSeq: c.nCtx})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			for range c.seqs {
				q, err := d.NewSequence(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				defer q.Close()
				for i := range c.steps {
					if _, err := q.Step(context.Background(), int64(i)); err != nil {
						t.Fatal(err)
					}
				}
			}
			n := kv.charged(t, "planned")
			if n != p.KVFull || p.KVPerSequence != c.wantPerSeq || p.KVTensors != d.Tensors() ||
				p.KVPerToken != memapi.Bytes(d.Tensors()*d.KVHeads())*d.RowBytes() {
				t.Errorf("%s, %v: charged %d, planned %d (%d a sequence, want %d); %d tensors planned, %d; %d per token",
					filepath.Base(path), c.mode, n, p.KVFull, p.KVPerSequence, c.wantPerSeq, p.KVTensors, d.Tensors(), p.KVPerToken)
			}
			t.Logf("%s, %v, %d × %d tokens: planned and charged %d", filepath.Base(path), c.mode, c.seqs, c.nCtx, n)
		}
	}
}
