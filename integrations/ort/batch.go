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

// Batch is a number of sequence slots of one Decoder whose caches are one
// tensor per layer's keys (and values): [slots, kv_heads, rows,
// head_size], GroupQueryAttention's BNSH, so that slot s's KV heads are
// contiguous slabs of rows × RowBytes from s × KVHeads slabs on. In KVGrow
// it is one pmm.Region per tensor (addresses only) in which each
// sequence's slabs are committed as it grows (each slab starts on a
// granule: the decoder's rows are rounded up for it); in KVPreallocated
// one Buffer per tensor, charged in full by NewBatch.
//
// Batch.NewSequence takes a free slot for a new Sequence: its Step and
// Prefill run alone over its slot (a Run of batch 1, so a prompt is
// prefilled alone in its slot), and Batch.Step runs one token of each of
// several of the batch's sequences in one Run of batch n. Closing a
// sequence decommits its slabs only (the others' are untouched) and frees
// its slot for the next NewSequence.
//
// Only ONNX Runtime GenAI's layout (a symbolic batch dimension) batches;
// a Batch is of KVGrow or KVPreallocated.
type Batch struct {
	d         *Decoder
	slots     int
	slotBytes memapi.Bytes // one slot's part of each tensor: KVHeads slabs
	mems      []kvMem      // per cache tensor
	regions   []*pmm.Region

	// C memory, per slot: input_ids, position_ids, seqlens_k; the
	// attention_mask of a Run ([n, total], rebuilt every Run), the
	// total_sequence_length and the logits [slots, 1, vocab].
	idsC, posC, seqlensC, totalC, maskC, logitsC unsafe.Pointer
	totalVal                                     *C.OrtValue
	views                                        map[[2]int]*batchView // by first slot and slots
	inVals, outVals                              []*C.OrtValue
	created                                      int
	runs                                         int // Runs made by Step
	ro                                           *C.OrtRunOptions

	// test hooks: a call before each Run of Step, and one once a Run's
	// terminate flag is set.
	beforeRun  func() error
	terminated func()

	mu       sync.Mutex
	seqs     []*Sequence // by slot; nil when free
	taken    []bool
	live     int
	stepping bool
	closed   bool
}

// batchView is the tensors of a Run over slots [lo, lo+n): the cache
// tensors (past and present) over those slots' part of each tensor, and
// the small inputs and the logits over theirs; made on first use, kept
// until Batch.Close.
type batchView struct {
	cache                         []*C.OrtValue // by cache tensor
	ids, pos, seqlens, logitsView *C.OrtValue
}

// NewBatch makes a batch of slots sequence slots: for KVGrow one Region per
// cache tensor of slots × KVHeads slabs (addresses only, nothing charged),
// for KVPreallocated one Buffer per cache tensor, charged in full. It
// fails with memapi.ErrUnsupported for a decoder of another layout than
// LayoutGenAI, of KVConcat, or whose model declares a batch of 1 (slots
// > 1), memapi.ErrInvalidSize for slots outside 1..1024, and
// memapi.ErrClosed once the decoder is closed. Close it after its
// sequences, before the Decoder.
func (d *Decoder) NewBatch(ctx context.Context, slots int) (*Batch, error) {
	const op = "ort.Decoder.NewBatch"
	switch {
	case d.layout != LayoutGenAI:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "the %v batches no sequences: only ONNX Runtime GenAI's layout (one cache tensor per layer, a symbolic batch) does", d.layout)
	case d.mode == KVConcat:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "KVConcat batches no sequences: a batch shares one cache tensor per layer (KVGrow, KVPreallocated)")
	case slots < 1 || slots > 1024:
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(max(slots, 0)), Available: 1024, Detail: "slots must be in 1..1024"}
	case d.batchOne && slots > 1:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "the model declares a batch of 1")
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "decoder is closed")
	}
	d.live++
	d.mu.Unlock()
	b := &Batch{d: d, slots: slots, slotBytes: memapi.Bytes(d.kvHeads) * memapi.Bytes(d.rows) * d.rowBytes,
		views: map[[2]int]*batchView{}, seqs: make([]*Sequence, slots), taken: make([]bool, slots),
		inVals: make([]*C.OrtValue, len(d.s.inputs)+1), outVals: make([]*C.OrtValue, len(d.s.outputs)+1)}
	if err := b.make(ctx); err != nil {
		err = errors.Join(err, b.free0())
		d.release()
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return b, nil
}

// make makes the batch's memory: the cache tensors' and the C memory.
func (b *Batch) make(ctx context.Context) error {
	d, n := b.d, C.size_t(b.slots)
	if err := cErr(C.memgen_ort_run_options_new(&b.ro)); err != nil {
		return err
	}
	b.idsC, b.posC, b.seqlensC, b.totalC = C.calloc(n, 8), C.calloc(n, 8), C.calloc(n, 4), C.calloc(1, 4)
	b.maskC, b.logitsC = C.calloc(n*C.size_t(d.maxSeq), 8), C.calloc(n*C.size_t(d.vocab), 4)
	for _, p := range []unsafe.Pointer{b.idsC, b.posC, b.seqlensC, b.totalC, b.maskC, b.logitsC} {
		if p == nil {
			return memapi.Errorf("ort.Decoder.NewBatch", memapi.ErrOutOfMemory, "calloc failed")
		}
	}
	if d.total >= 0 {
		if err := b.valueOver(&b.totalVal, uintptr(b.totalC), 4, elemInt32, ones(d.totalRank)...); err != nil {
			return err
		}
	}
	size := memapi.Bytes(b.slots) * b.slotBytes
	for range d.slots {
		if d.mode == KVGrow {
			r, err := d.bind.ReserveVirtual(ctx, size)
			if err != nil {
				return err
			}
			if gran := r.Granularity(); b.slotBytes%gran != 0 || (memapi.Bytes(d.rows)*d.rowBytes)%gran != 0 {
				// NewDecoder rounds the rows up so that every slab is
				// whole granules; this is a check of it.
				b.mems = append(b.mems, r)
				return memapi.Errorf("ort.Decoder.NewBatch", memapi.ErrUnaligned, "a KV head's slab of %d rows × %d bytes is not whole granules of %d", d.rows, d.rowBytes, gran)
			}
			b.regions = append(b.regions, r)
			b.mems = append(b.mems, r)
			continue
		}
		buf, err := d.bind.Allocate(ctx, size)
		if err != nil {
			return err
		}
		b.mems = append(b.mems, buf)
	}
	return nil
}

// valueOver makes a tensor over n bytes at p into *v, counted.
func (b *Batch) valueOver(v **C.OrtValue, p, n uintptr, elem int, shape ...int64) error {
	cs := make([]C.int64_t, len(shape)+1)
	for i, s := range shape {
		cs[i] = C.int64_t(s)
	}
	var made *C.OrtValue // C's out-parameter in Go memory of no Go pointer
	if err := cErr(C.memgen_ort_value_over(C.uintptr_t(p), C.size_t(n), &cs[0], C.size_t(len(shape)), C.int(elem), &made)); err != nil {
		return err
	}
	*v = made
	b.mu.Lock()
	b.created++
	b.mu.Unlock()
	return nil
}

// view returns the tensors of a Run over slots [lo, lo+n), made on first
// use.
func (b *Batch) view(lo, n int) (*batchView, error) {
	if v := b.views[[2]int{lo, n}]; v != nil {
		return v, nil
	}
	d := b.d
	v := &batchView{}
	b.views[[2]int{lo, n}] = v // freed by Close, whole or not
	nn := int64(n)
	if err := b.valueOver(&v.ids, uintptr(b.idsC)+uintptr(8*lo), uintptr(8*n), elemInt64, nn, 1); err != nil {
		return nil, err
	}
	if d.pos >= 0 {
		if err := b.valueOver(&v.pos, uintptr(b.posC)+uintptr(8*lo), uintptr(8*n), elemInt64, nn, 1); err != nil {
			return nil, err
		}
	}
	if d.seqlens >= 0 {
		shape := []int64{nn}
		if d.seqlensRank == 2 {
			shape = append(shape, 1)
		}
		if err := b.valueOver(&v.seqlens, uintptr(b.seqlensC)+uintptr(4*lo), uintptr(4*n), elemInt32, shape...); err != nil {
			return nil, err
		}
	}
	if err := b.valueOver(&v.logitsView, uintptr(b.logitsC)+uintptr(4*lo*d.vocab), uintptr(4*n*d.vocab), elemFloat, nn, 1, int64(d.vocab)); err != nil {
		return nil, err
	}
	for i := range d.slots {
		var c *C.OrtValue
		if err := b.valueOver(&c, uintptr(b.mems[i].Addr())+uintptr(memapi.Bytes(lo)*b.slotBytes), uintptr(memapi.Bytes(n)*b.slotBytes),
			elemFloat, nn, int64(d.kvHeads), int64(d.rows), int64(d.headSize)); err != nil {
			return nil, err
		}
		v.cache = append(v.cache, c)
	}
	return v, nil
}

// Slots returns the batch's number of slots.
func (b *Batch) Slots() int { return b.slots }

// NewSequence takes the lowest free slot and makes an empty sequence in
// it, of no backing (KVGrow) until it grows. It fails with
// memapi.ErrInUse when every slot is taken, memapi.ErrClosed once the
// batch is closed.
func (b *Batch) NewSequence(ctx context.Context) (*Sequence, error) {
	const op = "ort.Batch.NewSequence"
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "batch is closed")
	}
	slot := slices.Index(b.taken, false)
	if slot < 0 {
		b.mu.Unlock()
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInUse, Wanted: memapi.Bytes(b.slots + 1), Available: memapi.Bytes(b.slots),
			Detail: fmt.Sprintf("every one of the batch's %d slots holds a sequence", b.slots)}
	}
	b.taken[slot] = true
	b.live++
	b.mu.Unlock()
	q, err := b.d.newSequence(ctx, op, b, slot)
	if err != nil {
		b.free(slot, nil)
		return nil, err
	}
	b.mu.Lock()
	b.seqs[slot] = q
	b.mu.Unlock()
	return q, nil
}

// free gives slot back (q its sequence, or nil when it was not made).
func (b *Batch) free(slot int, q *Sequence) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.taken[slot] || b.seqs[slot] != q {
		return
	}
	b.taken[slot] = false
	b.seqs[slot] = nil
	b.live--
}

// releaseSlabs decommits what the sequence's slabs hold in the batch's
// Regions (KVGrow): each KV head's range from its slab's start, behind
// the fences of the Runs that used them. Called with q.mu held.
func (q *Sequence) releaseSlabs() error {
	if q.d.mode != KVGrow {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	slab := memapi.Bytes(q.d.rows) * q.d.rowBytes
	var errs error
	for i, r := range q.region {
		if q.perHead[i] == 0 {
			continue
		}
		for h := range memapi.Bytes(q.d.kvHeads) {
			errs = errors.Join(errs, r.Decommit(ctx, memapi.Range{Off: q.base + h*slab, Len: q.perHead[i]}))
		}
		q.perHead[i], q.backed[i] = 0, 0
	}
	return errs
}

// Step runs one token of each of seqs (tokens[i] for seqs[i]), sequences
// of this batch, in one Run of batch len(seqs) over their slots (in one
// Run per run of contiguous slots when their slots are not contiguous),
// and returns each one's logits (valid until its next step). Each
// sequence's token goes to its own row Tokens() of its own slabs: the
// Run's input_ids are [n, 1], its attention_mask [n, total] with each
// sequence's Tokens()+1 ones and zeros after them (total the longest), or
// seqlens_k [n] of each Tokens() and total_sequence_length the longest,
// as GroupQueryAttention takes a batch with the share buffer. In KVGrow
// every sequence's slabs are first grown to its rows, in one grow turn.
//
// It is all or nothing: a refused growth (a *GrowError of the sequence
// refused, wrapped), an ended context or a failed Run gives every growth
// back and leaves every sequence as it was. It fails with
// memapi.ErrInvalidSize when seqs is empty, longer than the batch's slots
// or of another length than tokens; memapi.ErrForeignHandle for a
// sequence of no slot of this batch; memapi.ErrInUse for a sequence given
// twice, one that steps elsewhere, or while another Step of the batch
// runs; memapi.ErrClosed for a closed sequence or batch;
// memapi.ErrInvalidRange for a full sequence or a token outside the
// vocabulary. None changes anything.
func (b *Batch) Step(ctx context.Context, seqs []*Sequence, tokens []int64) ([][]float32, error) {
	const op = "ort.Batch.Step"
	d := b.d
	switch {
	case len(seqs) == 0 || len(seqs) > b.slots || len(tokens) != len(seqs):
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Wanted: memapi.Bytes(len(seqs)), Available: memapi.Bytes(b.slots),
			Detail: fmt.Sprintf("%d sequences and %d tokens for a batch of %d slots", len(seqs), len(tokens), b.slots)}
	}
	for i, q := range seqs {
		switch {
		case q == nil || q.batch != b:
			return nil, memapi.Errorf(op, memapi.ErrForeignHandle, "sequence %d is not one of this batch's", i)
		case tokens[i] < 0 || tokens[i] >= int64(d.vocab):
			return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "token %d (sequence %d) outside the vocabulary of %d", tokens[i], i, d.vocab)
		}
		if j := slices.Index(seqs[:i], q); j >= 0 {
			return nil, memapi.Errorf(op, memapi.ErrInUse, "sequences %d and %d are the same (slot %d)", j, i, q.slot)
		}
	}
	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "batch is closed")
	case b.stepping:
		b.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrInUse, "another Step of the batch is running")
	}
	b.stepping = true
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.stepping = false
		b.mu.Unlock()
	}()
	// Every sequence is marked stepping, or none.
	pos := make([]int, len(seqs))
	for i, q := range seqs {
		q.mu.Lock()
		var err error
		switch {
		case q.closed:
			err = memapi.Errorf(op, memapi.ErrClosed, "sequence %d is closed", i)
		case q.stepping:
			err = memapi.Errorf(op, memapi.ErrInUse, "sequence %d: another Step or Prefill is running", i)
		case q.pos >= d.maxSeq:
			err = &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: memapi.Bytes(q.pos + 1), Available: memapi.Bytes(d.maxSeq), Detail: fmt.Sprintf("sequence %d is full", i)}
		}
		if err != nil {
			q.mu.Unlock()
			for _, p := range seqs[:i] {
				err = errors.Join(err, p.endStep(false, 0))
			}
			return nil, err
		}
		q.stepping = true
		pos[i] = q.pos
		q.mu.Unlock()
	}
	err := b.step(ctx, op, seqs, tokens, pos)
	for _, q := range seqs {
		if ferr := q.endStep(err == nil, 1); ferr != nil {
			err = errors.Join(err, ferr)
		}
	}
	if err != nil {
		return nil, err
	}
	out := make([][]float32, len(seqs))
	for i, q := range seqs {
		out[i] = q.logits
	}
	return out, nil
}

// step grows the sequences (KVGrow) and runs them, a Run per run of
// contiguous slots; on any failure it gives every growth back.
func (b *Batch) step(ctx context.Context, op string, seqs []*Sequence, tokens []int64, pos []int) (err error) {
	d := b.d
	if d.mode == KVGrow {
		type grew struct {
			q *Sequence
			g []growth
		}
		var done []grew
		giveBack := func() (errs error) {
			for _, x := range done {
				errs = errors.Join(errs, x.q.shrinkBack(x.g))
			}
			return errs
		}
		need := -1
		for i, q := range seqs {
			if !q.holds(pos[i] + 1) {
				need = i
				break
			}
		}
		if need >= 0 {
			if err := d.takeGrowTurn(ctx); err != nil {
				return fmt.Errorf("%s: sequence %d: %w", op, need, seqs[need].growRefused(pos[need]+1, err))
			}
			for i, q := range seqs {
				g, err := q.growHeld(ctx, pos[i]+1)
				if err != nil {
					d.giveGrowTurn()
					return fmt.Errorf("%s: sequence %d (slot %d): %w", op, i, q.slot, errors.Join(err, giveBack()))
				}
				done = append(done, grew{q, g})
			}
			d.giveGrowTurn()
			defer func() {
				if err != nil {
					err = errors.Join(err, giveBack())
				}
			}()
		}
	}
	f := newRunFence()
	defer f.complete()
	for _, m := range b.mems {
		if err := m.RecordUse(f); err != nil {
			return memapi.Errorf(op, memapi.ErrClosed, "batch closed before the run: %v", err)
		}
	}
	// The sequences by slot, in runs of contiguous slots.
	order := make([]int, len(seqs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return seqs[x].slot - seqs[y].slot })
	for start := 0; start < len(order); {
		end := start + 1
		for end < len(order) && seqs[order[end]].slot == seqs[order[end-1]].slot+1 {
			end++
		}
		if start > 0 && ctx.Err() != nil {
			return fmt.Errorf("%s: stopped after %d of %d sequences: %w", op, start, len(seqs), context.Cause(ctx))
		}
		if err := b.run(ctx, op, seqs, tokens, pos, order[start:end]); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// run runs one token of each of the sequences idx (indexes into seqs),
// whose slots are contiguous, in one Run, and copies each one's logits.
func (b *Batch) run(ctx context.Context, op string, seqs []*Sequence, tokens []int64, pos []int, idx []int) error {
	d := b.d
	lo, n := seqs[idx[0]].slot, len(idx)
	total := 0
	for _, i := range idx {
		total = max(total, pos[i]+1)
	}
	ids := unsafe.Slice((*int64)(b.idsC), b.slots)
	ps := unsafe.Slice((*int64)(b.posC), b.slots)
	sl := unsafe.Slice((*int32)(b.seqlensC), b.slots)
	for _, i := range idx {
		s := seqs[i].slot
		ids[s], ps[s], sl[s] = tokens[i], int64(pos[i]), int32(pos[i])
	}
	*(*int32)(b.totalC) = int32(total)
	v, err := b.view(lo, n)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	in, out := b.inVals, b.outVals
	clear(in)
	clear(out)
	in[d.ids] = v.ids
	if d.pos >= 0 {
		in[d.pos] = v.pos
	}
	if d.seqlens >= 0 {
		in[d.seqlens] = v.seqlens
	}
	if d.total >= 0 {
		in[d.total] = b.totalVal
	}
	out[d.logits] = v.logitsView
	for k, s := range d.slots {
		in[s.in], out[s.out] = v.cache[k], v.cache[k]
	}
	if d.mask >= 0 {
		// attention_mask [n, total]: each row its sequence's tokens, the
		// step's included, then zeros (right padding).
		mask := unsafe.Slice((*int64)(b.maskC), n*total)
		for r, i := range idx {
			row := mask[r*total : (r+1)*total]
			for j := range row {
				row[j] = 0
				if j <= pos[i] {
					row[j] = 1
				}
			}
		}
		var mv *C.OrtValue
		shape := []C.int64_t{C.int64_t(n), C.int64_t(total)}
		if err := cErr(C.memgen_ort_value_over(C.uintptr_t(uintptr(b.maskC)), C.size_t(8*n*total), &shape[0], 2, elemInt64, &mv)); err != nil {
			return fmt.Errorf("%s: attention_mask: %w", op, err)
		}
		in[d.mask] = mv
		defer C.memgen_ort_value_free(mv)
	}
	stop := terminateOn(ctx, b.ro, b.terminated)
	defer stop()
	if b.beforeRun != nil {
		if err := b.beforeRun(); err != nil {
			return err
		}
	}
	b.mu.Lock()
	b.runs++
	b.mu.Unlock()
	err = cErr(C.memgen_ort_run(d.s.s, b.ro, &d.inNames[0], &in[0], C.size_t(len(d.s.inputs)),
		&d.outNames[0], &out[0], C.size_t(len(d.s.outputs))))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: the run was stopped: %w", op, context.Cause(ctx))
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	all := unsafe.Slice((*float32)(b.logitsC), b.slots*d.vocab)
	for _, i := range idx {
		s := seqs[i].slot
		copy(seqs[i].logits, all[s*d.vocab:(s+1)*d.vocab])
	}
	return nil
}

// BatchStats are a batch's figures.
type BatchStats struct {
	Slots     int          // slots
	Sequences int          // slots holding a sequence
	Backed    memapi.Bytes // bytes backing the cache tensors: the sequences' slabs (KVGrow), the Buffers (KVPreallocated)
	// TensorsMade is the OrtValues the batch made: the
	// total_sequence_length's, and per pair of first slot and slots a Run
	// has covered, input_ids, position_ids and seqlens_k (those the model
	// has), logits and one per cache tensor. The attention_mask's header,
	// made anew each Run, is not counted.
	TensorsMade int
	Runs        int // Runs made by Step
}

// Stats returns the batch's figures.
func (b *Batch) Stats() BatchStats {
	b.mu.Lock()
	st := BatchStats{Slots: b.slots, TensorsMade: b.created, Runs: b.runs}
	seqs := slices.Clone(b.seqs)
	b.mu.Unlock()
	for _, q := range seqs {
		if q == nil {
			continue
		}
		st.Sequences++
		if b.d.mode == KVGrow {
			st.Backed += q.Stats().Backed
		}
	}
	if b.d.mode == KVPreallocated {
		st.Backed = memapi.Bytes(len(b.mems)*b.slots) * b.slotBytes
	}
	return st
}

// Close releases the batch's cache tensors and tensors. It fails with
// memapi.ErrInUse while sequences are open or a Step runs; later calls
// return nil.
func (b *Batch) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	if b.live > 0 || b.stepping {
		b.mu.Unlock()
		return memapi.Errorf("ort.Batch.Close", memapi.ErrInUse, "%d sequences are open", b.live)
	}
	b.closed = true
	b.mu.Unlock()
	err := b.free0()
	b.d.release()
	return err
}

// free0 releases the memory and tensors NewBatch made.
func (b *Batch) free0() error {
	var err error
	for _, m := range b.mems {
		err = errors.Join(err, m.Close())
	}
	b.mems, b.regions = nil, nil
	for _, v := range b.views {
		for _, c := range append([]*C.OrtValue{v.ids, v.pos, v.seqlens, v.logitsView}, v.cache...) {
			if c != nil {
				C.memgen_ort_value_free(c)
			}
		}
	}
	b.views = nil
	if b.totalVal != nil {
		C.memgen_ort_value_free(b.totalVal)
	}
	for _, p := range []unsafe.Pointer{b.idsC, b.posC, b.seqlensC, b.totalC, b.maskC, b.logitsC} {
		C.free(p)
	}
	if b.ro != nil {
		C.memgen_ort_run_options_free(b.ro)
	}
	return err
}
