package ort

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// kvMem is the memory of one cache tensor: a *pmm.Region (KVGrow) or a
// *pmm.Buffer (KVPreallocated).
type kvMem interface {
	Addr() memapi.DeviceAddr
	RecordUse(memapi.Fence) error
	Close() error
}

// scalars is the C memory of a sequence's small inputs and its logits,
// bound once.
type scalars struct {
	ids     C.int64_t
	pos     C.int64_t
	seqlens C.int32_t
	total   C.int32_t
}

// GrowError is a Step or Prefill refused because the cache could not grow to the
// rows the step writes: the governor refused a Region's growth (over
// budget within the caller's deadline), or the context ended while another
// sequence of the decoder was growing (kind memapi.ErrInUse). The
// regions that had grown for the step were shrunk back: the sequence holds
// what it held before, and can step again once there is room. Err is the
// growth's error (errors.Is(err, memapi.ErrOverBudget) when the budget was
// short), joined with the rollback's should that fail.
type GrowError struct {
	Tokens int          // tokens in the cache, the step's own included
	Wanted memapi.Bytes // bytes of backing the step needed in all: the granules its Regions would hold
	Held   memapi.Bytes // bytes of backing the sequence holds (as before the step)
	Err    error
}

func (e *GrowError) Error() string {
	return fmt.Sprintf("ort.Sequence: the KV cache cannot grow to %d tokens (%d bytes backed, %d wanted): %v",
		e.Tokens, e.Held, e.Wanted, e.Err)
}

func (e *GrowError) Unwrap() error { return e.Err }

// Sequence is one decoding sequence of a Decoder: its KV cache (in the
// decoder's mode) and its input, output and cache tensors, made once by
// NewSequence and bound to every Run. Step runs one token; Close releases
// the cache behind the fence of a Run in flight. A Sequence runs one Step
// at a time (a second concurrent Step fails with memapi.ErrInUse); Close,
// Stats and Tokens may come from any goroutine.
type Sequence struct {
	d       *Decoder
	mems    []kvMem       // per slot (not KVConcat)
	region  []*pmm.Region // per slot (KVGrow)
	backed  []memapi.Bytes
	perHead []memapi.Bytes // per slot (KVGrow): the bytes committed at the start of each KV head's slab

	// batch is the Batch whose slot the sequence occupies (nil for a
	// sequence of its own): its cache tensors are views of the batch's,
	// base bytes into each, and Close gives back its slabs and the slot.
	batch *Batch
	slot  int
	base  memapi.Bytes

	sc       *scalars // C memory
	maskC    unsafe.Pointer
	maskVal  *C.OrtValue // this step's attention_mask [1, tokens]: a new tensor header over maskC every step
	logitsC  unsafe.Pointer
	inVals   []*C.OrtValue
	outVals  []*C.OrtValue
	owned    []*C.OrtValue // values this sequence made, released at the end
	held     []*C.OrtValue // KVConcat, during a prompt of several Runs: the pasts it started with, per slot
	logits   []float32
	created  int
	runtime  int
	presentB int64

	ro *C.OrtRunOptions // every Run's: terminateOn raises its flag

	// test hooks: rows left unbacked below the step's need (the
	// one-row-short test), a call after each Region's growth, a call
	// before each Run, and one once a Run's terminate flag is set.
	short      int
	afterGrow  func(i int)
	beforeRun  func() error
	terminated func()

	mu       sync.Mutex
	pos      int
	stepping bool
	closed   bool
	freed    bool
	asleep   bool             // Sleep moved the KV cache to the host tier
	sleeping []*pmm.Offloaded // its host copies while asleep
}

// NewSequence makes an empty sequence: for KVGrow one Region of MaxSeq
// rows per cache tensor (addresses only, nothing charged), for
// KVPreallocated one Buffer of MaxSeq rows per cache tensor (charged in
// full), for KVConcat empty past tensors; and every tensor its steps bind.
func (d *Decoder) NewSequence(ctx context.Context) (*Sequence, error) {
	return d.newSequence(ctx, "ort.Decoder.NewSequence", nil, 0)
}

// newSequence makes a sequence of its own (b nil) or one in slot of batch
// b, whose slot the caller has taken.
func (d *Decoder) newSequence(ctx context.Context, op string, b *Batch, slot int) (*Sequence, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "decoder is closed")
	}
	d.live++
	d.mu.Unlock()
	q := &Sequence{d: d, logits: make([]float32, d.vocab), batch: b, slot: slot,
		inVals: make([]*C.OrtValue, len(d.s.inputs)+1), outVals: make([]*C.OrtValue, len(d.s.outputs)+1)}
	if b != nil {
		q.base = memapi.Bytes(slot) * b.slotBytes
	}
	err := cErr(C.memgen_ort_run_options_new(&q.ro))
	if err == nil {
		err = q.bind(ctx)
	}
	if err != nil {
		q.mu.Lock()
		q.closed = true
		if b != nil {
			err = errors.Join(err, q.releaseSlabs()) // the caller frees the slot
		} else {
			err = errors.Join(err, q.closeMems())
		}
		q.freeValues()
		q.mu.Unlock()
		d.release()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return q, nil
}

func (d *Decoder) release() {
	d.mu.Lock()
	d.live--
	d.mu.Unlock()
}

// valueOver makes a tensor over n bytes at address p (C memory or a
// memgen handle's), counted.
func (q *Sequence) valueOver(p uintptr, n uintptr, elem int, shape ...int64) (*C.OrtValue, error) {
	cs := make([]C.int64_t, len(shape)+1)
	for i, s := range shape {
		cs[i] = C.int64_t(s)
	}
	var v *C.OrtValue
	if err := cErr(C.memgen_ort_value_over(C.uintptr_t(p), C.size_t(n), &cs[0], C.size_t(len(shape)), C.int(elem), &v)); err != nil {
		return nil, err
	}
	q.created++
	q.owned = append(q.owned, v)
	return v, nil
}

// bind makes the sequence's memory and tensors.
func (q *Sequence) bind(ctx context.Context) error {
	d := q.d
	q.sc = (*scalars)(C.calloc(1, C.size_t(unsafe.Sizeof(scalars{}))))
	q.logitsC = C.calloc(C.size_t(d.vocab), 4)
	if q.sc == nil || q.logitsC == nil {
		return memapi.Errorf("ort.Decoder.NewSequence", memapi.ErrOutOfMemory, "calloc failed")
	}
	var err error
	if q.inVals[d.ids], err = q.valueOver(uintptr(unsafe.Pointer(&q.sc.ids)), 8, elemInt64, 1, 1); err != nil {
		return err
	}
	if d.pos >= 0 {
		if q.inVals[d.pos], err = q.valueOver(uintptr(unsafe.Pointer(&q.sc.pos)), 8, elemInt64, 1, 1); err != nil {
			return err
		}
	}
	if d.seqlens >= 0 {
		if q.inVals[d.seqlens], err = q.valueOver(uintptr(unsafe.Pointer(&q.sc.seqlens)), 4, elemInt32, ones(d.seqlensRank)...); err != nil {
			return err
		}
	}
	if d.total >= 0 {
		if q.inVals[d.total], err = q.valueOver(uintptr(unsafe.Pointer(&q.sc.total)), 4, elemInt32, ones(d.totalRank)...); err != nil {
			return err
		}
	}
	if d.mask >= 0 {
		// Every token is attended to: the mask is MaxSeq ones, of which
		// each step binds its tokens' prefix.
		if q.maskC = C.calloc(C.size_t(d.maxSeq), 8); q.maskC == nil {
			return memapi.Errorf("ort.Decoder.NewSequence", memapi.ErrOutOfMemory, "calloc failed")
		}
		for i := range unsafe.Slice((*int64)(q.maskC), d.maxSeq) {
			unsafe.Slice((*int64)(q.maskC), d.maxSeq)[i] = 1
		}
	}
	if q.outVals[d.logits], err = q.valueOver(uintptr(q.logitsC), uintptr(d.vocab)*4, elemFloat, 1, 1, int64(d.vocab)); err != nil {
		return err
	}
	heads := int64(d.kvHeads)
	size := memapi.Bytes(heads) * memapi.Bytes(d.rows) * d.rowBytes
	for _, sl := range d.slots {
		if d.mode == KVConcat {
			// An empty past for the first step; ONNX Runtime allocates
			// every present.
			if q.inVals[sl.in], err = q.valueOver(0, 0, elemFloat, 1, heads, 0, int64(d.headSize)); err != nil {
				return err
			}
			continue
		}
		var m kvMem
		switch {
		case q.batch != nil:
			// The slot's part of the batch's tensor: its KV heads' slabs,
			// contiguous, at base.
			m = q.batch.mems[len(q.mems)]
			if d.mode == KVGrow {
				q.region = append(q.region, q.batch.regions[len(q.mems)])
				q.backed = append(q.backed, 0)
				q.perHead = append(q.perHead, 0)
			} else {
				q.backed = append(q.backed, size)
			}
		case d.mode == KVGrow:
			r, err := d.bind.ReserveVirtual(ctx, size)
			if err != nil {
				return err
			}
			q.region = append(q.region, r)
			q.backed = append(q.backed, 0)
			q.perHead = append(q.perHead, 0)
			m = r
		default:
			b, err := d.bind.Allocate(ctx, size)
			if err != nil {
				return err
			}
			q.backed = append(q.backed, b.Size())
			m = b
		}
		q.mems = append(q.mems, m)
		v, err := q.valueOver(uintptr(m.Addr())+uintptr(q.base), uintptr(size), elemFloat, 1, heads, int64(d.rows), int64(d.headSize))
		if err != nil {
			return err
		}
		// Past and present are one tensor: GroupQueryAttention writes the
		// step's row of each KV head in place and reads the rows before it.
		q.inVals[sl.in], q.outVals[sl.out] = v, v
	}
	return nil
}

// ones is the shape of n ones (a rank-n tensor of one element).
func ones(n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = 1
	}
	return s
}

// Step runs one token through the decoder and returns its logits (valid
// until the next Step or Prefill). The token's keys and values go to row
// Tokens() of every cache tensor. In KVGrow mode every Region is first
// grown, through the governor and bounded by ctx, to the rows the step
// writes (rounded up to the mechanism's granularity); a refusal is a
// *GrowError and changes nothing (a wait for another sequence's growth
// that ctx ended is a *GrowError matching ctx's error), and a step that
// fails after growing gives the growth back. It fails with
// memapi.ErrClosed after Close, memapi.ErrInUse while another Step or
// Prefill runs, memapi.ErrInvalidRange when the sequence holds MaxSeq
// tokens or the token is outside the vocabulary.
func (q *Sequence) Step(ctx context.Context, token int64) ([]float32, error) {
	return q.advance(ctx, "ort.Sequence.Step", []int64{token})
}

// Prefill runs a prompt (or a continuation of the sequence) of
// len(tokens) tokens and returns the last token's logits (valid until the
// next Step or Prefill). The tokens run in one Run, or in Runs of
// DecoderOptions.PrefillChunk tokens (Decoder.PrefillChunk): input_ids
// [1, n], position_ids the tokens' positions, attention_mask
// [1, Tokens()+n], seqlens_k Tokens()+n-1 and total_sequence_length
// Tokens()+n, as GroupQueryAttention takes a prompt with the share buffer
// (Optimum's concat: the presents of one Run are the pasts of the next).
// In KVGrow mode every Region grows once, before the first Run, to the
// rows of the whole prompt (each KV head's range to Tokens()+n rows,
// rounded up to the mechanism's granularity). It is all or nothing: a
// refused growth (a *GrowError), a context that ends (between Runs or
// stopping one) or a failed Run gives the prompt's growth back and leaves
// the sequence as it was, its tokens, cache and charge those before the
// call. It fails with memapi.ErrInvalidSize for an empty prompt,
// memapi.ErrInvalidRange for a prompt beyond MaxSeq or a token outside the
// vocabulary, memapi.ErrClosed and memapi.ErrInUse as Step does.
func (q *Sequence) Prefill(ctx context.Context, tokens []int64) ([]float32, error) {
	return q.advance(ctx, "ort.Sequence.Prefill", tokens)
}

// advance checks and runs tokens for Step and Prefill (op).
func (q *Sequence) advance(ctx context.Context, op string, tokens []int64) ([]float32, error) {
	n := len(tokens)
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "sequence is closed")
	case q.stepping:
		q.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrInUse, "another Step or Prefill is running")
	case q.asleep:
		q.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", op, ErrAsleep)
	case n == 0:
		q.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "no tokens")
	case q.pos+n > q.d.maxSeq:
		q.mu.Unlock()
		detail := "the sequence is full"
		if n > 1 {
			detail = fmt.Sprintf("%d tokens after %d exceed MaxSeq", n, q.pos)
		}
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: memapi.Bytes(q.pos + n), Available: memapi.Bytes(q.d.maxSeq), Detail: detail}
	}
	for i, token := range tokens {
		if token < 0 || token >= int64(q.d.vocab) {
			q.mu.Unlock()
			if n == 1 {
				return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "token %d outside the vocabulary of %d", token, q.d.vocab)
			}
			return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "token %d (prompt index %d) outside the vocabulary of %d", token, i, q.d.vocab)
		}
	}
	q.stepping = true
	pos := q.pos
	q.mu.Unlock()

	err := q.step(ctx, op, pos, tokens)

	if ferr := q.endStep(err == nil, n); ferr != nil {
		err = errors.Join(err, ferr)
	}
	if err != nil {
		return nil, err
	}
	return q.logits, nil
}

// endStep ends a Step, Prefill or Batch.Step of the sequence: it is no
// longer stepping, and holds n more tokens when ok. Were it closed
// meanwhile, Close left its tensors (and, in a batch, its slabs and slot)
// to the step: they are released now, and the sequence's hold on the
// session with them; the error is the slabs' release's.
func (q *Sequence) endStep(ok bool, n int) error {
	q.mu.Lock()
	q.stepping = false
	if ok {
		q.pos += n
	}
	closed := q.closed
	var err error
	if closed {
		if q.batch != nil {
			err = q.closeMems()
		}
		q.freeValues()
	}
	q.mu.Unlock()
	if closed {
		q.d.release()
	}
	return err
}

// step grows the cache to pos+len(tokens) rows (KVGrow) once and runs the
// tokens in Runs of at most the decoder's chunk; on any failure it gives
// the growth back and, for KVConcat, binds the pasts it started with.
func (q *Sequence) step(ctx context.Context, op string, pos int, tokens []int64) (err error) {
	d := q.d
	n := len(tokens)
	if d.mode == KVGrow {
		grown, gerr := q.grow(ctx, pos+n)
		if gerr != nil {
			return gerr
		}
		// A step that fails after its growth gives the growth back: the
		// cache holds the rows of the tokens it had, no more.
		defer func() {
			if err != nil {
				err = errors.Join(err, q.shrinkBack(grown))
			}
		}()
	}
	if d.mode != KVConcat {
		f := newRunFence()
		defer f.complete()
		for _, m := range q.mems {
			if err := m.RecordUse(f); err != nil {
				return memapi.Errorf(op, memapi.ErrClosed, "sequence closed before the run: %v", err)
			}
		}
	}
	chunk := n
	if d.chunk > 0 {
		chunk = min(chunk, d.chunk)
	}
	var buf unsafe.Pointer // a Run of several tokens: their ids, then their positions
	if chunk > 1 {
		if buf = C.calloc(C.size_t(2*chunk), 8); buf == nil {
			return memapi.Errorf(op, memapi.ErrOutOfMemory, "calloc failed")
		}
		defer C.free(buf)
	}
	if d.mode == KVConcat && chunk < n {
		// The pasts the sequence had, kept until the whole prompt ran.
		q.mu.Lock()
		q.held = make([]*C.OrtValue, len(d.slots))
		for k, sl := range d.slots {
			q.held[k] = q.inVals[sl.in]
		}
		q.mu.Unlock()
		defer q.settlePasts(&err)
	}
	for off := 0; off < n; off += chunk {
		m := min(chunk, n-off)
		if off > 0 && ctx.Err() != nil {
			return fmt.Errorf("%s: stopped after %d of %d tokens: %w", op, off, n, context.Cause(ctx))
		}
		if err := q.run(ctx, op, pos+off, tokens[off:off+m], buf, off+m == n); err != nil {
			return err
		}
	}
	return nil
}

// settlePasts ends a KVConcat prompt of several Runs: on success it frees
// the pasts the sequence had (q.held); on failure it frees the presents
// bound since and binds the held pasts again.
func (q *Sequence) settlePasts(err *error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, sl := range q.d.slots {
		old, cur := q.held[k], q.inVals[sl.in]
		if old == cur {
			continue
		}
		if *err == nil {
			C.memgen_ort_value_free(old)
			continue
		}
		q.replacePast(sl.in, old, false)
	}
	q.held = nil
}

// run runs tokens, at positions pos.., in one Run. One token binds the
// sequence's own scalars and logits; several bind input_ids and
// position_ids [1, n] over buf and take logits [1, n, vocab] from ONNX
// Runtime, of which the last row is copied when last is set.
func (q *Sequence) run(ctx context.Context, op string, pos int, tokens []int64, buf unsafe.Pointer, last bool) (err error) {
	d := q.d
	n := len(tokens)
	total := pos + n
	q.sc.ids = C.int64_t(tokens[0])
	q.sc.pos = C.int64_t(pos)
	q.sc.seqlens = C.int32_t(total - 1)
	q.sc.total = C.int32_t(total)
	if n > 1 {
		ids := unsafe.Slice((*int64)(buf), 2*n)
		copy(ids, tokens)
		for i := range n {
			ids[n+i] = int64(pos + i)
		}
		boundIDs, boundPos, boundLogits := q.inVals[d.ids], q.inVals[max(d.pos, 0)], q.outVals[d.logits]
		shape := []C.int64_t{1, C.int64_t(n)}
		var vi, vp *C.OrtValue
		if err := cErr(C.memgen_ort_value_over(C.uintptr_t(uintptr(buf)), C.size_t(8*n), &shape[0], 2, elemInt64, &vi)); err != nil {
			return fmt.Errorf("%s: input_ids: %w", op, err)
		}
		q.inVals[d.ids] = vi
		if d.pos >= 0 {
			if err := cErr(C.memgen_ort_value_over(C.uintptr_t(uintptr(buf)+uintptr(8*n)), C.size_t(8*n), &shape[0], 2, elemInt64, &vp)); err != nil {
				C.memgen_ort_value_free(vi)
				q.inVals[d.ids] = boundIDs
				return fmt.Errorf("%s: position_ids: %w", op, err)
			}
			q.inVals[d.pos] = vp
		}
		q.outVals[d.logits] = nil // ONNX Runtime's: [1, n, vocab]
		defer func() {
			if v := q.outVals[d.logits]; v != nil {
				if err == nil && last {
					err = q.copyLastLogits(op, v, n)
				}
				C.memgen_ort_value_free(v)
			}
			q.outVals[d.logits] = boundLogits
			C.memgen_ort_value_free(vi)
			q.inVals[d.ids] = boundIDs
			if vp != nil {
				C.memgen_ort_value_free(vp)
				q.inVals[d.pos] = boundPos
			}
		}()
	}
	if d.mask >= 0 {
		// attention_mask [1, tokens]: the tensor's shape is the step's, so
		// its header is made anew over the same ones (GenAI's and
		// Optimum's own loops feed a new, longer mask every step too).
		var v *C.OrtValue
		shape := []C.int64_t{1, C.int64_t(total)}
		if err := cErr(C.memgen_ort_value_over(C.uintptr_t(uintptr(q.maskC)), C.size_t(8*total), &shape[0], 2, elemInt64, &v)); err != nil {
			return fmt.Errorf("%s: attention_mask: %w", op, err)
		}
		q.maskVal = v
		q.inVals[d.mask] = v
		defer func() {
			q.inVals[d.mask] = nil
			C.memgen_ort_value_free(q.maskVal)
			q.maskVal = nil
		}()
	}
	stop := terminateOn(ctx, q.ro, q.terminated)
	defer stop()
	if q.beforeRun != nil {
		if err := q.beforeRun(); err != nil {
			return err
		}
	}
	if d.mode == KVConcat {
		for _, sl := range d.slots {
			q.outVals[sl.out] = nil
		}
	}
	err = cErr(C.memgen_ort_run(d.s.s, q.ro, &d.inNames[0], &q.inVals[0], C.size_t(len(d.s.inputs)),
		&d.outNames[0], &q.outVals[0], C.size_t(len(d.s.outputs))))
	if d.mode == KVConcat {
		for k, sl := range d.slots {
			v := q.outVals[sl.out]
			q.outVals[sl.out] = nil
			if v == nil {
				continue
			}
			if err != nil {
				C.memgen_ort_value_free(v)
				continue
			}
			// The present becomes the next step's past; the past is
			// freed unless a prompt of several Runs holds it.
			q.mu.Lock()
			q.runtime++
			q.presentB += int64(total) * int64(d.kvHeads) * int64(d.rowBytes)
			q.replacePast(sl.in, v, q.held != nil && q.held[k] == q.inVals[sl.in])
			q.mu.Unlock()
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			// The run stopped at the terminate flag the context's end
			// raised: what happened is the context's.
			return fmt.Errorf("%s: the run was stopped: %w", op, context.Cause(ctx))
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if n == 1 {
		copy(q.logits, unsafe.Slice((*float32)(q.logitsC), d.vocab))
	}
	return nil
}

// copyLastLogits copies the last of the n rows of logits v (ONNX
// Runtime's [1, n, vocab]) to the sequence's logits.
func (q *Sequence) copyLastLogits(op string, v *C.OrtValue, n int) error {
	var onnxType, elem C.int
	var shape [8]C.int64_t
	var rank, count C.size_t
	var data unsafe.Pointer
	if err := cErr(C.memgen_ort_value_info(v, &onnxType, &elem, &shape[0], 8, &rank, &count, &data)); err != nil {
		return fmt.Errorf("%s: logits: %w", op, err)
	}
	vocab := q.d.vocab
	if elem != elemFloat || int(count) != n*vocab || data == nil {
		return memapi.Errorf(op, memapi.ErrUnsupported, "logits of %d elements (type %d), want %d × %d floats", int(count), int(elem), n, vocab)
	}
	copy(q.logits, unsafe.Slice((*float32)(data), n*vocab)[(n-1)*vocab:])
	return nil
}

// terminateOn stops a step's Run once ctx ends: then
// (context.AfterFunc: no goroutine until it ends) the run options' (ro's)
// terminate flag is set, which ONNX Runtime reads at the start of the run
// and between its nodes. The returned stop waits for a setting under way
// and clears the flag.
func terminateOn(ctx context.Context, ro *C.OrtRunOptions, terminated func()) (stop func()) {
	if ctx.Done() == nil {
		return func() {}
	}
	set := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		_ = cErr(C.memgen_ort_run_options_terminate(ro, 1)) // fails only on a NULL options
		if terminated != nil {
			terminated()
		}
		close(set)
	})
	return func() {
		if !cancel() {
			<-set
		}
		_ = cErr(C.memgen_ort_run_options_terminate(ro, 0))
	}
}

// replacePast frees input i's past value (unless keep: a prompt of
// several Runs holds it, in q.held) and binds v in its place; called with
// q.mu held.
func (q *Sequence) replacePast(i int, v *C.OrtValue, keep bool) {
	old := q.inVals[i]
	for k, o := range q.owned {
		if o == old {
			q.owned = append(q.owned[:k], q.owned[k+1:]...)
			break
		}
	}
	if !keep {
		C.memgen_ort_value_free(old)
	}
	q.inVals[i] = v
	q.owned = append(q.owned, v)
}

// growth is one Region's growth in a step: the ranges committed (one per
// KV head) and the bytes per head before.
type growth struct {
	slot   int
	prev   memapi.Bytes
	ranges []memapi.Range
}

// grow backs every Region's KV heads up to rows tokens before the run:
// each head's range, at the start of its slab (rows × RowBytes apart), is
// committed (pmm.Region.Commit) from what it holds to the step's rows
// rounded up to the granularity. A Region grows only when rows no longer
// fit in what it has (once per granule of rows); all of them grow at the
// same step, in the decoder's grow turn (one sequence at a time), taken
// bounded by ctx. A refused growth decommits the ranges committed for this
// step. It returns the growths, for a step that fails later to give them
// back (shrinkBack).
func (q *Sequence) grow(ctx context.Context, rows int) (grown []growth, err error) {
	if q.holds(rows) {
		return nil, nil // every Region holds the rows already
	}
	if err := q.d.takeGrowTurn(ctx); err != nil {
		return nil, q.growRefused(rows, err)
	}
	defer q.d.giveGrowTurn()
	return q.growHeld(ctx, rows)
}

// holds reports whether every Region backs rows tokens already.
func (q *Sequence) holds(rows int) bool {
	return memapi.Bytes(rows-q.short)*q.d.rowBytes <= slices.Min(q.perHead)
}

// takeGrowTurn waits for the decoder's grow turn, bounded by ctx.
func (d *Decoder) takeGrowTurn(ctx context.Context) error {
	select {
	case d.growTurn <- struct{}{}:
		return nil
	case <-ctx.Done():
		// What ended the wait is the caller's context: its error, not a
		// refusal.
		return fmt.Errorf("waiting for another sequence's growth: %w", context.Cause(ctx))
	}
}

func (d *Decoder) giveGrowTurn() { <-d.growTurn }

// growRefused is the *GrowError of a growth to rows tokens refused with
// err: the bytes the sequence holds and those its Regions would hold.
func (q *Sequence) growRefused(rows int, err error) error {
	need := memapi.Bytes(rows-q.short) * q.d.rowBytes
	heads := memapi.Bytes(q.d.kvHeads)
	var held, wanted memapi.Bytes
	for i, b := range q.backed {
		held += b
		// What the Region would hold: its granules, not the bytes.
		w, _ := memapi.RoundUp(need, q.region[i].Granularity())
		wanted += heads * max(w, q.perHead[i])
	}
	return &GrowError{Tokens: rows, Wanted: wanted, Held: held, Err: err}
}

// growHeld is grow's work, in the grow turn the caller holds.
func (q *Sequence) growHeld(ctx context.Context, rows int) (grown []growth, err error) {
	d := q.d
	need := memapi.Bytes(rows-q.short) * d.rowBytes
	slab := memapi.Bytes(d.rows) * d.rowBytes
	for i, r := range q.region {
		have := q.perHead[i]
		if need <= have {
			continue
		}
		to, _ := memapi.RoundUp(need, r.Granularity())
		gr := growth{slot: i, prev: have}
		for h := range memapi.Bytes(d.kvHeads) {
			rng := memapi.Range{Off: q.base + h*slab + have, Len: to - have}
			if err := r.Commit(ctx, rng); err != nil {
				return nil, q.growRefused(rows, errors.Join(err, q.shrinkBack(append(grown, gr))))
			}
			gr.ranges = append(gr.ranges, rng)
		}
		grown = append(grown, gr)
		q.setBacked(i, to)
		if q.afterGrow != nil {
			q.afterGrow(i)
		}
	}
	return grown, nil
}

// setBacked records Region i's bytes per KV head (Stats reads them from
// any goroutine; only the stepping one writes them, so it reads them
// without the lock).
func (q *Sequence) setBacked(i int, perHead memapi.Bytes) {
	q.mu.Lock()
	q.perHead[i] = perHead
	q.backed[i] = perHead * memapi.Bytes(q.d.kvHeads)
	q.mu.Unlock()
}

// shrinkBack decommits the ranges in grown, returning each Region to its
// bytes before. It runs after the caller's context may have ended (a
// refusal within the deadline), so it is bounded by its own: nothing else
// holds the regions' transactions, and their earlier releases wait for no
// running step.
func (q *Sequence) shrinkBack(grown []growth) error {
	if len(grown) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs error
	for _, gr := range grown {
		for _, rng := range gr.ranges {
			if err := q.region[gr.slot].Decommit(ctx, rng); err != nil {
				errs = errors.Join(errs, err)
			}
		}
		q.setBacked(gr.slot, gr.prev)
	}
	return errs
}

// Close releases the sequence: its cache memory (each handle behind the
// fence of a Run still in flight, refunded after its free) and its tensors
// (at once, or when the Step in flight returns). The sequence holds the
// decoder's session until a Step in flight returns, so Decoder.Close
// refuses (memapi.ErrInUse) rather than free the session under the Run.
// A sequence of a Batch decommits its own slabs of the batch's Regions
// and frees its slot (once a step that runs it has ended). Later calls
// return nil.
func (q *Sequence) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	stepping := q.stepping
	var err error
	if !stepping && q.asleep {
		// The KV cache's host copies go with it.
		err = dropSleeping(q.sleeping)
		q.sleeping, q.asleep = nil, false
	}
	if q.batch == nil || !stepping {
		// A sequence of its own closes its handles at once (released
		// behind the fence of a Run in flight); a batch's slot gives its
		// slabs and the slot back once its step has ended (endStep).
		err = errors.Join(err, q.closeMems())
	}
	if !stepping {
		q.freeValues()
	}
	q.mu.Unlock()
	if !stepping {
		q.d.release()
	} // else the running Step releases it as it returns: until then the decoder's session is in use, and Decoder.Close refuses
	return err
}

func (q *Sequence) closeMems() error {
	if q.batch != nil {
		err := q.releaseSlabs()
		q.batch.free(q.slot, q)
		return err
	}
	var err error
	for _, m := range q.mems {
		err = errors.Join(err, m.Close())
	}
	return err
}

// freeValues releases the tensors and the C memory; called with q.mu held
// once no Run uses them.
func (q *Sequence) freeValues() {
	if q.freed {
		return
	}
	q.freed = true
	for _, v := range q.owned {
		C.memgen_ort_value_free(v)
	}
	q.owned = nil
	clear(q.inVals)
	clear(q.outVals)
	C.free(unsafe.Pointer(q.sc))
	C.free(q.logitsC)
	C.free(q.maskC)
	q.sc, q.logitsC, q.maskC = nil, nil, nil
	C.memgen_ort_run_options_free(q.ro)
	q.ro = nil
}

// Tokens returns the tokens in the cache.
func (q *Sequence) Tokens() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pos
}

// SequenceStats are a sequence's figures.
type SequenceStats struct {
	Tokens int // tokens in the cache
	// Backed is the bytes backing the cache tensors: the ranges the
	// Regions' KV heads hold (KVGrow), the Buffers' sizes (KVPreallocated), 0 for KVConcat
	// (ONNX Runtime's own memory).
	Backed memapi.Bytes
	// TensorsMade is the OrtValues the sequence made in NewSequence: one
	// per small input the model has (input_ids, position_ids, seqlens_k,
	// total_sequence_length), logits and one per cache tensor (past and
	// present being one). The attention_mask's header, made anew each
	// step, is not counted.
	TensorsMade int
	// RuntimeTensors is the present tensors ONNX Runtime allocated during
	// the steps (KVConcat: one per cache tensor per step; else 0), and
	// PresentBytes their bytes: the cache the concat way copies.
	RuntimeTensors int
	PresentBytes   int64
}

// Stats returns the sequence's figures.
func (q *Sequence) Stats() SequenceStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	var b memapi.Bytes
	for _, n := range q.backed {
		b += n
	}
	return SequenceStats{Tokens: q.pos, Backed: b, TensorsMade: q.created, RuntimeTensors: q.runtime, PresentBytes: q.presentB}
}

// valuesMade returns how many OrtValues this package has made in the
// process (memgen_ort_values_made).
func valuesMade() int64 { return int64(C.memgen_ort_values_made()) }

// binding is one cache tensor as a step binds it: the past input's and
// the present output's OrtValue, the address of the value's data, and the
// address of its memory (0 for KVConcat).
type binding struct {
	past, present uintptr
	data          uintptr
	mem           memapi.DeviceAddr
}

// bindings returns the cache tensors' bindings, in the decoder's order;
// for the tests, between steps.
func (q *Sequence) bindings() ([]binding, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]binding, len(q.d.slots))
	for i, sl := range q.d.slots {
		v := q.inVals[sl.in]
		var p unsafe.Pointer
		if err := cErr(C.memgen_ort_value_data(v, &p)); err != nil {
			return nil, err
		}
		out[i] = binding{past: uintptr(unsafe.Pointer(v)), present: uintptr(unsafe.Pointer(q.outVals[sl.out])), data: uintptr(p)}
		if q.mems != nil {
			out[i].mem = q.mems[i].Addr()
		}
	}
	return out, nil
}

// zeroAt writes n zero bytes at address p; for the tests (cgo cannot be
// called from test files).
func zeroAt(p uintptr, n int) { C.memgen_ort_zero(C.uintptr_t(p), C.size_t(n)) }
