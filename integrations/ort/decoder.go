package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"fmt"
	"strconv"
	"strings"
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
}

// The decoder model's interface (scripts/ort.sh builds one): inputs
// input_ids (int64 [1,1]), seqlens_k (int32 [1]: tokens in the cache
// before this one), total_sequence_length (int32 scalar: with this one),
// and past_key.L.G / past_value.L.G (float [1,1,rows,head_size]) for layer
// L and KV head G; outputs logits (float [1,1,vocab]) and
// present_key.L.G / present_value.L.G. Each cache tensor holds one KV head:
// com.microsoft::GroupQueryAttention's cache is BNSH, heads outer, so a
// tensor of several KV heads would have its used rows at the start of each
// head's slab, not one prefix; with one KV head per tensor (one
// GroupQueryAttention node per KV head and layer, its query heads split
// off) the rows in use are always a prefix, and a Region backed from its
// start holds exactly them.
const (
	inIDs      = "input_ids"
	inSeqlens  = "seqlens_k"
	inTotal    = "total_sequence_length"
	outLogits  = "logits"
	pastPrefix = "past_"
	presPrefix = "present_"
)

// kvSlot is one cache tensor: a KV head's keys or values in one layer.
type kvSlot struct {
	name     string // key.L.G or value.L.G
	in, out  int    // the session's input and output index of past_name, present_name
	layer    int
	kvHead   int
	isValue  bool
	dimsPast []int64
}

// Decoder is a loaded decoder model with a KV cache of its mode. Make
// sequences with NewSequence; close them before the Decoder.
type Decoder struct {
	mode     KVMode
	bind     *pmm.Binding // nil for KVConcat
	maxSeq   int
	headSize int
	vocab    int
	rowBytes memapi.Bytes // one token's keys (or values) of one KV head

	s        *session
	slots    []kvSlot
	ids      int // input indexes
	seqlens  int
	total    int
	logits   int // output index
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
// may be nil. A model without the interface above is refused with an error
// of kind memapi.ErrUnsupported naming what is missing; one whose
// GroupQueryAttention nodes contradict it (several KV heads per cache
// tensor, a rotary cache wider than the head size) or whose rotary cache
// has fewer rows than MaxSeq with a *LimitError (checkGraph). Nothing is
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
	threads := opts.Threads
	if threads <= 0 {
		threads = 1
	}
	var s *session
	var err error
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
	d := &Decoder{mode: opts.Mode, bind: bind, maxSeq: opts.MaxSeq, s: s, growTurn: make(chan struct{}, 1)}
	if err := d.inspect(); err != nil {
		s.close()
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "%s is not a share-buffer GroupQueryAttention decoder: %v", path, err)
	}
	if err := d.checkGraph(path); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %s: %w", op, path, err)
	}
	d.rowBytes = memapi.Bytes(d.headSize) * 4
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

// inspect finds the model's inputs and outputs (the interface above).
func (d *Decoder) inspect() error {
	const elemInt64, elemInt32 = 7, 6
	d.ids, d.seqlens, d.total, d.logits = -1, -1, -1, -1
	outIdx := map[string]int{}
	for i, o := range d.s.outputs {
		outIdx[o.name] = i
	}
	for i, in := range d.s.inputs {
		want := 0
		switch {
		case in.name == inIDs:
			d.ids, want = i, elemInt64
		case in.name == inSeqlens:
			d.seqlens, want = i, elemInt32
		case in.name == inTotal:
			d.total, want = i, elemInt32
		case strings.HasPrefix(in.name, pastPrefix):
			sl, err := d.slot(i, in.name, outIdx)
			if err != nil {
				return err
			}
			d.slots = append(d.slots, sl)
			want = elemFloat
		default:
			return fmt.Errorf("unexpected input %q", in.name)
		}
		if in.elemType != want {
			return fmt.Errorf("input %q has element type %d, want %d", in.name, in.elemType, want)
		}
	}
	if d.ids < 0 || d.seqlens < 0 || d.total < 0 {
		return fmt.Errorf("inputs %s, %s and %s are required", inIDs, inSeqlens, inTotal)
	}
	if len(d.slots) == 0 {
		return fmt.Errorf("no %sKIND.LAYER.HEAD inputs", pastPrefix)
	}
	i, ok := outIdx[outLogits]
	if !ok || d.s.outputs[i].elemType != elemFloat {
		return fmt.Errorf("no float output %q", outLogits)
	}
	dims, err := d.dims(true, i)
	if err != nil {
		return err
	}
	if len(dims) != 3 || dims[0] != 1 || dims[1] != 1 || dims[2] <= 0 {
		return fmt.Errorf("output %q has shape %v, want [1 1 vocab]", outLogits, dims)
	}
	d.logits, d.vocab = i, int(dims[2])
	if len(d.s.outputs) != 1+len(d.slots) {
		return fmt.Errorf("%d outputs, want logits and %d presents", len(d.s.outputs), len(d.slots))
	}
	return nil
}

// slot reads past input i (past_key.L.G or past_value.L.G) and finds its
// present output.
func (d *Decoder) slot(i int, name string, outIdx map[string]int) (kvSlot, error) {
	rest := strings.TrimPrefix(name, pastPrefix)
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || (parts[0] != "key" && parts[0] != "value") {
		return kvSlot{}, fmt.Errorf("input %q is not past_key.LAYER.HEAD or past_value.LAYER.HEAD", name)
	}
	layer, err1 := strconv.Atoi(parts[1])
	head, err2 := strconv.Atoi(parts[2])
	if err1 != nil || err2 != nil || layer < 0 || head < 0 {
		return kvSlot{}, fmt.Errorf("input %q: layer and head must be numbers", name)
	}
	out, ok := outIdx[presPrefix+rest]
	if !ok {
		return kvSlot{}, fmt.Errorf("input %q has no output %q", name, presPrefix+rest)
	}
	dims, err := d.dims(false, i)
	if err != nil {
		return kvSlot{}, err
	}
	if len(dims) != 4 || dims[0] != 1 || dims[1] != 1 || dims[3] <= 0 || dims[3]%4 != 0 {
		return kvSlot{}, fmt.Errorf("input %q has shape %v, want [1 1 rows head_size] (one KV head per tensor, head_size a multiple of 4)", name, dims)
	}
	if d.headSize == 0 {
		d.headSize = int(dims[3])
	} else if d.headSize != int(dims[3]) {
		return kvSlot{}, fmt.Errorf("input %q has head size %d, others %d", name, dims[3], d.headSize)
	}
	return kvSlot{name: rest, in: i, out: out, layer: layer, kvHead: head, isValue: parts[0] == "value", dimsPast: dims}, nil
}

// Mode returns the decoder's KV mode.
func (d *Decoder) Mode() KVMode { return d.mode }

// MaxSeq returns the most tokens a sequence holds.
func (d *Decoder) MaxSeq() int { return d.maxSeq }

// Vocab returns the number of logits per step.
func (d *Decoder) Vocab() int { return d.vocab }

// Tensors returns the number of cache tensors of a sequence (layers × KV
// heads × 2).
func (d *Decoder) Tensors() int { return len(d.slots) }

// RowBytes returns the bytes of one token in one cache tensor (head size ×
// 4): a Region of a KVGrow sequence holding n tokens is n × RowBytes
// rounded up to the mechanism's granularity.
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
