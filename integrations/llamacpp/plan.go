package llamacpp

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp/gguf"
	"github.com/memgen/memgen/memreport"
)

// PlanOptions is the configuration a plan sizes: the context options
// NewContext takes (NCtx per sequence, Batch, UBatch, Sequences, with the
// same defaults).
type PlanOptions struct {
	NCtx      int
	Batch     int
	UBatch    int
	Sequences int
}

// Plan is the memory a model and one context of it take, sized before any
// byte is committed: llama.cpp sizes its buffers for the exact
// configuration with its allocations simulated (llama_model_params.no_alloc:
// the GGUF's metadata is read, not its weights), and reports them in its
// memory breakdown; the output buffer and the per-cell bookkeeping, which
// the breakdown leaves out, are added from llama.cpp's own formulas.
type Plan struct {
	Model     string `json:"model"`
	NCtx      int    `json:"n_ctx"` // per sequence
	Sequences int    `json:"sequences"`
	Batch     int    `json:"batch"`
	UBatch    int    `json:"ubatch"`
	// Weights is llama.cpp's model buffers.
	Weights memapi.Bytes `json:"weights"`
	// KVPerToken is one cell of the KV cache: K and V of every layer.
	KVPerToken memapi.Bytes `json:"kv_per_token"`
	// KVFull is the KV cache with every sequence at NCtx: llama.cpp's
	// context buffers.
	KVFull memapi.Bytes `json:"kv_full"`
	// Compute is the scheduler's compute buffers (activations), sized for
	// UBatch tokens against the whole context.
	Compute memapi.Bytes `json:"compute"`
	// Output is the output buffer: the logits of one token per sequence
	// (n_vocab x Sequences x 4 bytes).
	Output memapi.Bytes `json:"output"`
	// Metadata is llama.cpp's bookkeeping on the C heap at creation: the
	// model's, measured (what the heap grew by while the plan loaded its
	// metadata: the vocabulary, the tensor table), and the cells', from
	// llama.cpp's layout (48 bytes a cell: position, shift, extension and
	// the sequence set).
	Metadata memapi.Bytes `json:"metadata"`
	// MetadataFull adds what the cells in use take at full context, from
	// llama.cpp's layout: 88 bytes a cell (a node of the used-cell set and
	// one of its sequence's position set).
	MetadataFull memapi.Bytes `json:"metadata_full"`
	// Buffers is the breakdown as llama.cpp reported it, per buffer type.
	Buffers []PlanBuffer `json:"buffers"`
	// Took is how long the plan took (the simulated load included).
	Took time.Duration `json:"took_ns"`
}

// PlanBuffer is one buffer type's bytes in llama.cpp's breakdown.
type PlanBuffer struct {
	Type    string       `json:"type"`
	Model   memapi.Bytes `json:"model"`
	Context memapi.Bytes `json:"context"`
	Compute memapi.Bytes `json:"compute"`
}

// StockAtStart is what stock llama.cpp allocates at creation: the KV cache
// of every sequence at NCtx included.
func (p *Plan) StockAtStart() memapi.Bytes {
	return p.Weights + p.KVFull + p.Compute + p.Output + p.Metadata
}

// AtStart is what memgen's engine holds at creation, before a token: the
// KV cache is committed as tokens arrive.
func (p *Plan) AtStart() memapi.Bytes { return p.Weights + p.Compute + p.Output + p.Metadata }

// AtFull is what either holds with every sequence at NCtx.
func (p *Plan) AtFull() memapi.Bytes {
	return p.Weights + p.KVFull + p.Compute + p.Output + p.MetadataFull
}

// The bookkeeping of a cell, from llama.cpp's llama_kv_cells: at creation
// its position, shift and extension (16 bytes) and its sequence set (a
// 256-bit bitset); in use, a node of the used-cell set (std::set of
// uint32_t: 40 bytes with malloc's header) and one of its sequence's
// position set (48).
const (
	metaPerCell = 48
	metaPerUsed = 88
)

// PlanContext sizes the model at path and a context configured by o
// without allocating: llama.cpp loads the GGUF's metadata with its
// allocations simulated and reports what it would allocate. Init must
// have loaded the library. The model's metadata is checked first (a
// *LimitError beyond its trained context, as NewContext refuses).
func PlanContext(path string, o PlanOptions) (*Plan, error) {
	const op = "llamacpp.PlanContext"
	start := time.Now()
	if !loaded() {
		return nil, ErrNotLoaded
	}
	if o.Batch <= 0 {
		o.Batch = 512
	}
	if o.Sequences == 0 {
		o.Sequences = 1
	}
	if o.NCtx <= 0 || o.Sequences < 0 || o.Sequences > maxSequences || (o.Sequences > 1 && o.NCtx%seqPad != 0) {
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "%d sequences of n_ctx %d: n_ctx above 0, 1 to %d sequences, and with several an n_ctx that is a multiple of %d",
			o.Sequences, o.NCtx, maxSequences, seqPad)
	}
	o.Batch = min(o.Batch, o.NCtx*o.Sequences)
	if o.UBatch <= 0 || o.UBatch > o.Batch {
		o.UBatch = o.Batch
	}
	info, err := gguf.Check(path)
	if err != nil {
		return nil, err
	}
	arch := info.String("general.architecture")
	if train, ok := info.Uint(arch + ".context_length"); ok && train > 0 && uint64(o.NCtx) > train {
		return nil, &LimitError{Field: "n_ctx", Value: o.NCtx, Limit: int(min(train, 1<<31-1)),
			Reason: "the model's trained context (" + arch + ".context_length); RoPE scaling beyond it is not offered"}
	}
	emb, ok := info.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 || emb.Dims[1] == 0 {
		return nil, &gguf.FormatError{Path: path, Kind: gguf.ErrCorrupt, Detail: "no token_embd.weight of 2 dimensions"}
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var out [16]C.struct_memgen_llama_mem
	var heap C.uint64_t
	loadMu.Lock()
	lastError()
	n := int(C.memgen_llama_plan(cpath, C.uint32_t(o.NCtx*o.Sequences), C.uint32_t(o.Batch), C.uint32_t(o.UBatch), C.uint32_t(o.Sequences), &out[0], C.int(len(out)), &heap))
	msg := lastError()
	loadMu.Unlock()
	switch {
	case n == -1:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "this libllama exports no llama_get_memory_breakdown: it cannot size a configuration without allocating it")
	case n == -2:
		return nil, fmt.Errorf("%w: %s: %s", ErrModel, path, msg)
	case n == -3:
		return nil, fmt.Errorf("%w: %s", ErrContext, msg)
	case n > len(out):
		return nil, fmt.Errorf("%w: llama.cpp reported %d buffer types, more than the %d a plan reads", ErrContext, n, len(out))
	}
	p := &Plan{Model: path, NCtx: o.NCtx, Sequences: o.Sequences, Batch: o.Batch, UBatch: o.UBatch, Buffers: planBuffers(out[:n])}
	for _, b := range p.Buffers {
		p.Weights += b.Model
		p.KVFull += b.Context
		p.Compute += b.Compute
	}
	cells := memapi.Bytes(o.NCtx * o.Sequences)
	p.KVPerToken = p.KVFull / cells
	p.Output = memapi.Bytes(emb.Dims[1]) * memapi.Bytes(o.Sequences) * 4
	p.Metadata = memapi.Bytes(heap) + cells*metaPerCell
	p.MetadataFull = p.Metadata + cells*metaPerUsed
	p.Took = time.Since(start)
	return p, nil
}

// Need is what the engine needs of a shared ledger by this plan: the
// weights, and the totals at start and at full context.
func (p *Plan) Need() xproc.Need {
	b := memreport.FormatBytes
	return xproc.Need{Weights: p.Weights, Start: p.AtStart(), Full: p.AtFull(),
		StartParts: fmt.Sprintf("weights %s, compute %s, output %s, metadata %s", b(p.Weights), b(p.Compute), b(p.Output), b(p.Metadata))}
}

// FitLedger answers whether the plan fits the shared ledger h (read with
// xproc.Inspect): its start and its full context against the ledger's
// free bytes and capacity.
func (p *Plan) FitLedger(h xproc.Header) xproc.Fit { return h.Fit(p.Need()) }

func planBuffers(es []C.struct_memgen_llama_mem) []PlanBuffer {
	out := make([]PlanBuffer, 0, len(es))
	for i := range es {
		e := &es[i]
		out = append(out, PlanBuffer{Type: C.GoString(&e.name[0]), Model: memapi.Bytes(e.model), Context: memapi.Bytes(e.context), Compute: memapi.Bytes(e.compute)})
	}
	return out
}

// breakdown is what llama.cpp reports it allocated for c and its model,
// per buffer type: the yardstick a plan is held to.
func (c *Context) breakdown() ([]PlanBuffer, error) {
	var out [16]C.struct_memgen_llama_mem
	n := int(C.memgen_llama_breakdown(C.memgen_llama_api.handle, c.c, &out[0], C.int(len(out))))
	if n < 0 || n > len(out) {
		return nil, fmt.Errorf("%w: no memory breakdown (%d)", ErrContext, n)
	}
	return planBuffers(out[:n]), nil
}

// CheckLedger plans the model and a context configured by o
// (PlanContext) and reads the shared ledger at ledger without joining it
// (xproc.CheckFit): a plan that never fits is an *xproc.FitError; any
// other answer is returned with the plan. A missing or unreadable ledger
// is xproc's typed error. Nothing is joined or charged either way.
func CheckLedger(ledger, model string, o PlanOptions) (*Plan, xproc.Fit, error) {
	if _, _, err := xproc.Inspect(ledger); err != nil {
		return nil, xproc.Fit{}, err
	}
	p, err := PlanContext(model, o)
	if err != nil {
		return nil, xproc.Fit{}, err
	}
	f, err := xproc.CheckFit(ledger, model, p.Need())
	return p, f, err
}
