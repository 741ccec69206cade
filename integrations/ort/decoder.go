package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// KVMode says where a Sequence keeps its KV cache.
type KVMode int

const (
	// KVGrow binds each cache tensor once over a memgen Region of
	// MaxSeq rows (addresses only) and grows the Region, through the
	// governor, to the rows the next step writes before it runs. Past and
	// present are the same tensor (GroupQueryAttention's share buffer).
	KVGrow KVMode = iota
	// KVPreallocated binds each cache tensor once over a pmm.Buffer of
	// MaxSeq rows, committed and charged in full when the sequence is made
	// (ONNX Runtime GenAI's share buffer). Past and present are the same
	// tensor.
	KVPreallocated
	// KVConcat feeds each step's present outputs, which ONNX Runtime
	// allocates with its own allocator, as the next step's past inputs:
	// the past/present way, where every step copies the whole cache.
	// Nothing is charged to the binding.
	KVConcat
)

func (m KVMode) String() string {
	switch m {
	case KVGrow:
		return "grow"
	case KVPreallocated:
		return "preallocated"
	case KVConcat:
		return "concat"
	}
	return "KVMode(" + strconv.Itoa(int(m)) + ")"
}

// DecoderOptions configure NewDecoder.
type DecoderOptions struct {
	// Mode is where sequences keep their KV cache.
	Mode KVMode
	// MaxSeq is the most tokens a sequence holds: the rows of each share
	// buffer (the model's rotary caches must cover it). Required.
	MaxSeq int
	// Threads is ONNX Runtime's intra-op thread count; 0 means 1.
	Threads int
	// Workspace is the Allocator the decoder's session takes ONNX
	// Runtime's memory from: the weights (initializers), each step's
	// activations and outputs (the logits), all charged to the
	// Allocator's holder beside the KV cache's. It must be the Allocator
	// registered with the environment when NewDecoder runs (a session
	// keeps the allocator it was created with); NewDecoder fails with
	// memapi.ErrForeignHandle otherwise, memapi.ErrClosed once it is
	// closed. nil: ONNX Runtime's own allocator, outside the ledger.
	Workspace *Allocator
	// PrefillChunk is the most prompt tokens Sequence.Prefill runs in one
	// Run: 0 runs the whole prompt in one; a model whose input_ids or
	// logits declare a length of 1 runs one token per Run whatever it is.
	// Negative is memapi.ErrInvalidSize.
	PrefillChunk int
}

// Decoder is a loaded decoder model with a KV cache of its mode. Make
// sequences with NewSequence; close them before the Decoder.
type Decoder struct {
	mode     KVMode
	bind     *pmm.Binding // nil for KVConcat
	maxSeq   int
	rowBytes memapi.Bytes // one token's keys (or values) of one KV head
	// rows is each KV head's rows in a share buffer: MaxSeq, raised in
	// KVGrow mode for a tensor of several KV heads, or of a batch's
	// several sequences (LayoutGenAI), so that each head's slab starts on
	// a granule of the mechanism (its ranges are committed apart).
	rows int
	// chunk is the most tokens one Run of a Prefill takes (0: the whole
	// prompt).
	chunk int

	s *session
	ioLayout
	inNames  []*C.char
	outNames []*C.char

	// growTurn lets one sequence at a time grow its Regions: a step's
	// growths are one unit. Were they interleaved, concurrent steps could
	// each take part of the room and wait for the rest, and all be refused
	// where one could have grown.
	growTurn chan struct{}

	mu     sync.Mutex
	live   int
	closed bool
}

// NewDecoder loads the decoder model at path with ONNX Runtime's own CPU
// allocator for its weights and intermediates. bind is the binding whose
// holder is charged for the sequences' caches (KVGrow, KVPreallocated; its
// device's mechanism must offer VirtualBacking for KVGrow); for KVConcat it
// may be nil. The model's layout (Layout) is read as it was exported:
// memgen's per-head decoder, ONNX Runtime GenAI's model builder's (share
// buffer, with attention_mask or seqlens_k and total_sequence_length) or
// Hugging Face Optimum's decoder with past (concat; KVConcat only, else
// memapi.ErrUnsupported), with symbolic batch and sequence dimensions. A
// model of no such layout is refused with a *LayoutError (matching
// memapi.ErrUnsupported) naming the input or output and what the layout
// expected; one whose GroupQueryAttention nodes contradict its tensors
// (kv_num_heads, a rotary cache wider than the head size) or whose rotary
// cache has fewer rows than MaxSeq with a *LimitError. Nothing is
// committed before these checks.
func NewDecoder(path string, bind *pmm.Binding, opts DecoderOptions) (*Decoder, error) {
	const op = "ort.NewDecoder"
	switch opts.Mode {
	case KVGrow, KVPreallocated:
		if bind == nil {
			return nil, memapi.Errorf(op, memapi.ErrNilHandle, "mode %v needs a binding", opts.Mode)
		}
	case KVConcat:
	default:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "unknown KV mode %d", int(opts.Mode))
	}
	if opts.MaxSeq <= 0 || opts.MaxSeq > 1<<24 {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(max(opts.MaxSeq, 0)), Detail: "MaxSeq must be in 1..2^24"}
	}
	if opts.PrefillChunk < 0 {
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "PrefillChunk %d is negative", opts.PrefillChunk)
	}
	// The layout is read from the graph first: a model of no layout is
	// refused before ONNX Runtime loads it.
	g, err := readGraph(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	if _, err := readLayout(declaredInputs(g), g.outputs, g, opts.MaxSeq); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	threads := opts.Threads
	if threads <= 0 {
		threads = 1
	}
	var s *session
	if opts.Workspace == nil {
		s, err = newSessionWith(path, 0, threads)
	} else {
		err = opts.Workspace.whileRegistered(op, func() (err error) {
			s, err = newSessionWith(path, sessEnvAllocators, threads)
			return err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	d := &Decoder{mode: opts.Mode, bind: bind, maxSeq: opts.MaxSeq, rows: opts.MaxSeq, chunk: opts.PrefillChunk, s: s, growTurn: make(chan struct{}, 1)}
	if err := d.readLayout(g); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	if d.oneToken {
		d.chunk = 1 // the model declares one token per Run
	}
	if d.layout == LayoutOptimum && opts.Mode != KVConcat {
		s.close()
		return nil, memapi.Errorf(op, memapi.ErrUnsupported,
			"%s has the %v layout: its graph concatenates each step's keys and values to the past into a new present, so no buffer can be bound once as past and present; decode it with KVConcat", path, d.layout)
	}
	d.rowBytes = memapi.Bytes(d.headSize) * 4
	if opts.Mode == KVGrow && (d.kvHeads > 1 || d.layout == LayoutGenAI) {
		if err := d.alignRows(); err != nil {
			s.close()
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	for _, in := range s.inputs {
		d.inNames = append(d.inNames, C.CString(in.name))
	}
	for _, out := range s.outputs {
		d.outNames = append(d.outNames, C.CString(out.name))
	}
	d.inNames = append(d.inNames, nil)
	d.outNames = append(d.outNames, nil)
	return d, nil
}

// dims returns the declared dimensions of input (out false) or output i.
func (d *Decoder) dims(out bool, i int) ([]int64, error) {
	var dims [8]C.int64_t
	var rank C.size_t
	o := C.int(0)
	if out {
		o = 1
	}
	if err := cErr(C.memgen_ort_session_dims(d.s.s, o, C.size_t(i), &dims[0], 8, &rank)); err != nil {
		return nil, err
	}
	r := make([]int64, int(rank))
	for k := range r {
		r[k] = int64(dims[k])
	}
	return r, nil
}

// readLayout reads the model's layout: its inputs and outputs as the
// session declares them (their indexes are the session's), and its graph
// g's GroupQueryAttention nodes.
func (d *Decoder) readLayout(g *graph) error {
	var io [2][]valueInfo
	for out, infos := range [][]ioInfo{d.s.inputs, d.s.outputs} {
		for i, x := range infos {
			dims, err := d.dims(out == 1, i)
			if err != nil {
				return err
			}
			io[out] = append(io[out], valueInfo{name: x.name, elem: int64(x.elemType), dims: dims})
		}
	}
	l, err := readLayout(io[0], io[1], g, d.maxSeq)
	if err != nil {
		return err
	}
	d.ioLayout = *l
	return nil
}

// alignRows raises rows so that each KV head's slab of a share buffer
// (rows × RowBytes) is whole granules of the binding's mechanism, read
// from a Region reserved for the purpose (addresses only) and released.
func (d *Decoder) alignRows() error {
	r, err := d.bind.ReserveVirtual(context.Background(), d.rowBytes)
	if err != nil {
		return err
	}
	gran := r.Granularity()
	if err := r.Close(); err != nil {
		return err
	}
	unit := int(gran / gcd(gran, d.rowBytes)) // rows whose bytes are whole granules
	d.rows = (d.maxSeq + unit - 1) / unit * unit
	return nil
}

func gcd(a, b memapi.Bytes) memapi.Bytes {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Layout returns the model's layout.
func (d *Decoder) Layout() Layout { return d.layout }

// KVHeads returns the KV heads in each cache tensor: 1 in LayoutPerHead,
// the model's KV heads otherwise.
func (d *Decoder) KVHeads() int { return d.kvHeads }

// PrefillChunk returns the most tokens one Run of Sequence.Prefill takes:
// DecoderOptions.PrefillChunk, 1 for a model that declares a length of 1,
// 0 for the whole prompt in one Run.
func (d *Decoder) PrefillChunk() int { return d.chunk }

// Mode returns the decoder's KV mode.
func (d *Decoder) Mode() KVMode { return d.mode }

// MaxSeq returns the most tokens a sequence holds.
func (d *Decoder) MaxSeq() int { return d.maxSeq }

// Vocab returns the number of logits per step.
func (d *Decoder) Vocab() int { return d.vocab }

// Tensors returns the number of cache tensors of a sequence: layers × KV
// heads × 2 in LayoutPerHead, layers × 2 otherwise (each of KVHeads
// heads).
func (d *Decoder) Tensors() int { return len(d.slots) }

// RowBytes returns the bytes of one token of one KV head (head size × 4):
// each KV head's range in a KVGrow sequence's Region holding n tokens is
// n × RowBytes rounded up to the mechanism's granularity.
func (d *Decoder) RowBytes() memapi.Bytes { return d.rowBytes }

// Close releases the session. It fails with memapi.ErrInUse while
// sequences are open.
func (d *Decoder) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	if d.live > 0 {
		return memapi.Errorf("ort.Decoder.Close", memapi.ErrInUse, "%d sequences are open", d.live)
	}
	d.closed = true
	d.s.close()
	for _, n := range append(d.inNames, d.outNames...) {
		C.free(unsafe.Pointer(n))
	}
	d.inNames, d.outNames = nil, nil
	return nil
}
