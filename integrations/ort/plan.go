package ort

import (
	"fmt"
	"os"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/memreport"
)

// PlanOptions is the configuration a decoder plan sizes: the decoder's
// MaxSeq and KV mode, how many sequences decode at once, and the
// granularities its memory is charged in.
type PlanOptions struct {
	// NCtx is the most tokens of one sequence (DecoderOptions.MaxSeq).
	// Required.
	NCtx int
	// Sequences is how many sequences hold their KV cache at once; 0
	// means 1.
	Sequences int
	// Mode is the sequences' KV mode: KVGrow (the default) or
	// KVPreallocated, which take the same bytes at full context
	// (KVPreallocated at each sequence's start). KVConcat keeps its cache
	// in ONNX Runtime's own memory, outside any plan's reach: refused.
	Mode KVMode
	// KVGranule is the granularity of the KV cache's mechanism (each
	// cache tensor's rows are committed in whole granules); 0 means 4 KiB,
	// the CPU mechanism's small pages.
	KVGranule memapi.Bytes
	// PoolSegment is the least the workspace Allocator's pool takes from
	// its binding at a time (pool.Options.SegmentBytes); 0 means 2 MiB,
	// the pool's default.
	PoolSegment memapi.Bytes
}

// DecoderPlan is the memory a decoder model and its sequences take,
// sized from the model's graph before any byte is committed and before
// ONNX Runtime is loaded: the initializers' dimensions and element types,
// the cache inputs' shapes and the nodes, read from the protobuf (the
// weights' bytes are skipped, not read).
type DecoderPlan struct {
	Model     string `json:"model"`
	NCtx      int    `json:"n_ctx"`
	Sequences int    `json:"sequences"`
	Mode      string `json:"mode"`
	// Weights is every initializer: the bytes ONNX Runtime holds for the
	// model (in the workspace Allocator, or, for the few a kernel keeps
	// itself, in its own heap).
	Weights      memapi.Bytes `json:"weights"`
	Initializers int          `json:"initializers"`
	// KVPerToken is one token's keys and values in every cache tensor.
	KVPerToken memapi.Bytes `json:"kv_per_token"`
	KVTensors  int          `json:"kv_tensors"`
	// KVPerSequence is one sequence at NCtx tokens: each cache tensor's
	// rows rounded up to whole granules.
	KVPerSequence memapi.Bytes `json:"kv_per_sequence"`
	// KVFull is every sequence at NCtx.
	KVFull memapi.Bytes `json:"kv_full"`
	// Activations bounds one step's intermediates: every node output of
	// one token at the graph's widest row (the logits' vocabulary or an
	// initializer's last dimension), as if none were reused.
	Activations memapi.Bytes `json:"activations"`
	// Compute is what the workspace pool takes from its binding for them:
	// Activations in whole pool segments.
	Compute memapi.Bytes `json:"compute"`
	// Load is the model's protobuf, which ONNX Runtime holds while it
	// loads the model (the file's size): transient, gone once the session
	// is made, but part of the peak at start.
	Load memapi.Bytes `json:"load"`
	// Took is how long the plan took.
	Took time.Duration `json:"took_ns"`
}

// AtStart is what the decoder holds once loaded, before a sequence: the
// weights and the workspace's compute.
func (p *DecoderPlan) AtStart() memapi.Bytes { return p.Weights + p.Compute }

// AtFull is what it holds with every sequence at NCtx.
func (p *DecoderPlan) AtFull() memapi.Bytes { return p.AtStart() + p.KVFull }

// Peak is the most it holds at any time: at full context, or while the
// model loads (its protobuf beside the weights ONNX Runtime has copied),
// whichever is more.
func (p *DecoderPlan) Peak() memapi.Bytes { return max(p.AtFull(), p.AtStart()+p.Load) }

// Need is what the decoder needs of a shared ledger by this plan.
func (p *DecoderPlan) Need() xproc.Need {
	b := memreport.FormatBytes
	return xproc.Need{Weights: p.Weights, Start: p.AtStart(), Full: p.AtFull(),
		StartParts: fmt.Sprintf("weights %s, compute %s", b(p.Weights), b(p.Compute))}
}

// PlanDecoder sizes the decoder model at path and o's sequences from the
// model's graph alone, for the layouts whose cache a Decoder binds
// (LayoutPerHead, LayoutGenAI: a KVGrow sequence at NCtx holds each KV
// head's NCtx rows in whole granules, a KVPreallocated one a Buffer of
// all of them). A model of no layout is a *LayoutError (matching
// memapi.ErrUnsupported), as NewDecoder refuses it, and Optimum's concat
// layout memapi.ErrUnsupported; an NCtx beyond the model's rotary cache,
// or GroupQueryAttention nodes contradicting the cache tensors, a
// *LimitError; a bad configuration memapi.ErrInvalidSize; a missing file
// fs.ErrNotExist.
func PlanDecoder(path string, o PlanOptions) (*DecoderPlan, error) {
	const op = "ort.PlanDecoder"
	start := time.Now()
	if o.Sequences == 0 {
		o.Sequences = 1
	}
	if o.KVGranule == 0 {
		o.KVGranule = 4 << 10
	}
	if o.PoolSegment == 0 {
		o.PoolSegment = 2 << 20
	}
	switch {
	case o.NCtx <= 0 || o.NCtx > 1<<24 || o.Sequences < 0 || o.Sequences > 1<<20:
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "%d sequences of %d tokens: NCtx must be in 1..2^24, sequences in 1..2^20", o.Sequences, o.NCtx)
	case o.KVGranule&(o.KVGranule-1) != 0 || o.KVGranule > 1<<30 || o.PoolSegment > 1<<40:
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "KV granule %d (a power of two up to 1 GiB) or pool segment %d (up to 1 TiB)", o.KVGranule, o.PoolSegment)
	case o.Mode == KVConcat:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "mode %v keeps the cache in ONNX Runtime's own memory, which a plan cannot size", o.Mode)
	case o.Mode != KVGrow && o.Mode != KVPreallocated:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "unknown KV mode %d", int(o.Mode))
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	g, err := readGraph(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	p := &DecoderPlan{Model: path, NCtx: o.NCtx, Sequences: o.Sequences, Mode: o.Mode.String(), Load: memapi.Bytes(st.Size()), Initializers: len(g.order)}
	width := int64(1)
	for _, name := range g.order {
		dims, size := g.dims[name], int64(elemSize[int(g.types[name])])
		if size == 0 {
			return nil, memapi.Errorf(op, memapi.ErrUnsupported, "initializer %s has element type %d, whose size a plan does not know", name, g.types[name])
		}
		n := size
		for _, d := range dims {
			if d < 0 || d > 1<<40 || d > 0 && n > (1<<50)/d {
				return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "%s: initializer %s declares dimensions %v: more than 2^50 bytes", path, name, dims)
			}
			n *= d
		}
		if p.Weights += memapi.Bytes(n); p.Weights > 1<<60 {
			return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "%s: the initializers declare more than 2^60 bytes", path)
		}
		if len(dims) > 0 {
			width = max(width, dims[len(dims)-1])
		}
	}
	// The layout, as NewDecoder reads it (the graph's declared inputs and
	// outputs, less initializers listed as inputs, as the session has them).
	l, err := readLayout(declaredInputs(g), g.outputs, g, o.NCtx)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	if l.layout == LayoutOptimum {
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "%s has the %v layout, which decodes in KVConcat mode only: its cache is in ONNX Runtime's own memory, which a plan cannot size", path, l.layout)
	}
	row := memapi.Bytes(l.headSize) * 4
	heads := memapi.Bytes(l.kvHeads)
	round := func(n memapi.Bytes) memapi.Bytes { return (n + o.KVGranule - 1) &^ (o.KVGranule - 1) }
	for range l.slots {
		p.KVPerToken += heads * row
		if o.Mode == KVGrow {
			// Each KV head's range holds its rows in whole granules.
			p.KVPerSequence += heads * round(memapi.Bytes(o.NCtx)*row)
		} else {
			// One Buffer of every head's rows, in whole granules.
			p.KVPerSequence += round(heads * memapi.Bytes(o.NCtx) * row)
		}
	}
	vocab := int64(l.vocab)
	p.KVTensors = len(l.slots)
	p.KVFull = p.KVPerSequence * memapi.Bytes(o.Sequences)
	outputs := 0
	for _, n := range g.nodes {
		outputs += n.outputs
	}
	if row := max(width, vocab); row > 1<<32 || int64(outputs) > 1<<24 {
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "%s: %d node outputs, a row of %d elements: more than a plan bounds", path, outputs, row)
	}
	p.Activations = memapi.Bytes(int64(outputs) * max(width, vocab) * 4)
	p.Compute = (p.Activations + o.PoolSegment - 1) / o.PoolSegment * o.PoolSegment
	p.Took = time.Since(start)
	return p, nil
}
