package llamacpp

/*
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/cgo"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// ContextOptions configure Model.NewContext.
type ContextOptions struct {
	// NCtx is the most tokens of one sequence: the cells of its KV stream,
	// each KV tensor is reserved for NCtx rows per sequence. Required.
	NCtx int
	// Batch is the most tokens one llama_decode takes (n_batch); longer
	// inputs are decoded in batches (the KV regions grow once for the
	// whole Decode). Default 512.
	Batch int
	// UBatch is the most tokens llama.cpp computes at once (n_ubatch): a
	// batch is computed in ubatches of UBatch tokens, and llama.cpp's
	// compute buffer (activations, charged to the context: Compute) is
	// sized for UBatch tokens against all of NCtx. Default (and at most)
	// Batch.
	UBatch int
	// Sequences is how many sequences the context decodes together
	// (llama.cpp's n_seq_max), each in a KV stream of its own (its
	// non-unified cache): every (layer, sequence) range of K and V is
	// contiguous, and grows, through the governor, as its sequence does.
	// Default 1; at most 256. With several, NCtx must be a multiple of 256
	// (llama.cpp pads each stream to it) and each stream a whole number of
	// granules.
	Sequences int
	// Priority is the context's holder's priority: under pressure the
	// governor asks lower priorities first.
	Priority int
	// NoFlashAttention asks for llama.cpp's attention without flash
	// attention. It is refused (memapi.ErrUnsupported) at NewContext:
	// without it llama.cpp stores V transposed, one row of n_ctx per
	// channel, so a growing region would be touched whole by the first
	// token, and its kernels read cells past the live ones.
	NoFlashAttention bool
	// OffloadTo, when set, is the host tier (a binding of the model's
	// manager on another authority) a sequence given up under pressure
	// moves to, instead of having its cells dropped and recomputed: the
	// next DecodeBatch that names it copies them back first (see Reclaim).
	OffloadTo *pmm.Binding
	// Preempt is the policy for each sequence given up under pressure:
	// "" (automatic) offloads it when OffloadTo is set, it is not
	// finished (FinishSeq) and the host tier's authority has its bytes
	// free, and recomputes it otherwise (or when the move fails);
	// "offload" always tries the move (OffloadTo required,
	// memapi.ErrNilHandle otherwise) and leaves a sequence whose move
	// fails resident; "recompute" never moves. Any other value is
	// memapi.ErrUnsupported.
	Preempt string
}

// Context is one llama.cpp context running one sequence, and the governor
// holder of its KV cache (Holder). Each of its KV tensors is a pmm.Region
// reserved for NCtx rows; before each Decode's first llama_decode the
// regions are grown, through the governor, to the rows its decodes use
// (the cells so far plus its tokens, and the rest of a 64-row tile for a
// ubatch of 64 tokens or more), and after its last they hold its cells:
// llama.cpp touches no other row (flash attention reads only the cells
// the mask lets through, and writes only the batch's). Its methods are
// safe for concurrent use; a Context decodes one call at a time.
type Context struct {
	m      *Model
	holder governor.HolderID
	bind   *pmm.Binding
	nCtx   int
	batch  int
	ubatch int
	c      *C.struct_llama_context
	work   *pmm.Binding // role "compute": the compute and output buffers
	self   cgo.Handle   // the context as the owner of llama.cpp's allocations for it

	// allocCtx bounds the buffers allocated during a creation or a decode
	// (set around the call), allocErr is the first refusal of one.
	allocCtx context.Context
	allocErr error
	abort    *C.int // C memory: set, llama_decode aborts (abortOn); freed by release

	mu        sync.Mutex // held by every call; TryLock by Reclaim
	closed    bool
	bufs      []*kvBuffer
	tensors   []*kvTensor
	host      []*hostBuffer // compute and output buffers
	freed     []*pmm.Region // closed regions not yet waited for
	hostFreed []*pmm.Buffer // closed host buffers not yet waited for
	seqs      []seqState    // the sequences, each in its KV stream
	stats     Stats
	asleep    bool         // the model's Sleep moved the KV cache to the host tier
	sleeping  []hostCopier // its host copies while asleep
	offloadTo *pmm.Binding // ContextOptions.OffloadTo
	preempt   string       // ContextOptions.Preempt
}

// Stats are a context's counters.
type Stats struct {
	Decodes     int           // llama_decode calls
	Tokens      int           // tokens decoded, recomputed ones included
	Grows       int           // decodes that had to grow the regions
	GrowTime    time.Duration // time spent growing (governor and commit)
	Preemptions int           // sequences the holder gave up under pressure (each victim once)
	Recomputed  int           // tokens decoded again after preemptions
	// Offloads counts the preemptions that moved a sequence's KV cache to
	// the host tier (ContextOptions.OffloadTo) rather than dropping it,
	// Restores the times a call copied one back, Moved the bytes moved
	// both ways and MoveTime the time the moves took.
	Offloads, Restores int
	Moved              memapi.Bytes
	MoveTime           time.Duration
}

// NewContext creates a llama.cpp context of opts.NCtx cells for the model,
// whose KV cache is placed in memgen's regions, charged to a holder of its
// own (Model's Name + "/ctx<N>") registered with the governor. Nothing of
// the KV cache is committed until the first decode; the compute and output
// buffers llama.cpp makes for the context are committed whole and charged
// to the same holder (binding role "compute"). Before anything is
// allocated, opts is checked against the model's GGUF metadata: an n_ctx
// beyond the trained context is a *LimitError, and a context whose whole
// KV cache and the model's weights could never fit the authority's
// capacity together (one sequence at its longest) an *OverBudgetError;
// after llama.cpp made the context, its KV cache, its compute buffers and
// the weights are checked against the capacity the same way.
func (m *Model) NewContext(ctx context.Context, opts ContextOptions) (*Context, error) {
	const op = "llamacpp.Model.NewContext"
	if opts.Batch <= 0 {
		opts.Batch = 512
	}
	if opts.NCtx <= 0 {
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "n_ctx %d", opts.NCtx)
	}
	if opts.Sequences == 0 {
		opts.Sequences = 1
	}
	if opts.Sequences < 0 || opts.Sequences > maxSequences || (opts.Sequences > 1 && opts.NCtx%seqPad != 0) {
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "%d sequences of n_ctx %d: 1 to %d sequences, and with several an n_ctx that is a multiple of %d",
			opts.Sequences, opts.NCtx, maxSequences, seqPad)
	}
	switch {
	case opts.Preempt != preemptAuto && opts.Preempt != preemptOffload && opts.Preempt != preemptRecompute:
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "preemption policy %q (\"\", %q or %q)", opts.Preempt, preemptOffload, preemptRecompute)
	case opts.Preempt == preemptOffload && opts.OffloadTo == nil:
		return nil, memapi.Errorf(op, memapi.ErrNilHandle, "preemption policy %q without OffloadTo", opts.Preempt)
	}
	if opts.NoFlashAttention {
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "a context without flash attention: its V cache is one row of n_ctx per channel, which a growing region cannot back")
	}
	if err := m.checkContext(opts.NCtx); err != nil {
		return nil, err
	}
	// A context is made in the model's sleep turn: Sleep and Wake never
	// see one half made.
	if err := takeTurn(ctx, op, m.sleepTurn); err != nil {
		return nil, err
	}
	defer func() { <-m.sleepTurn }()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "model %s was closed", m.path)
	}
	if m.asleep {
		m.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", op, ErrAsleep)
	}
	m.nextID++
	c := &Context{m: m, nCtx: opts.NCtx, batch: min(opts.Batch, opts.NCtx*opts.Sequences), seqs: make([]seqState, opts.Sequences), offloadTo: opts.OffloadTo, preempt: opts.Preempt}
	c.ubatch = c.batch
	if opts.UBatch > 0 {
		c.ubatch = min(opts.UBatch, c.batch)
	}
	m.contexts[c] = struct{}{}
	m.mu.Unlock()
	fail := func(err error) (*Context, error) {
		m.mu.Lock()
		delete(m.contexts, c)
		m.mu.Unlock()
		return nil, errors.Join(err, c.release(ctx))
	}
	if !m.opts.Stock {
		c.holder = governor.HolderID(fmt.Sprintf("%s/ctx%d", m.opts.Name, m.nextID))
		if err := m.opts.Governor.Register(c.holder, c, governor.HolderOptions{Priority: opts.Priority}); err != nil {
			return fail(err)
		}
		b, err := m.opts.Manager.Bind(string(c.holder), "kv", m.opts.Device)
		if err != nil {
			return fail(err)
		}
		c.bind = b
		if c.work, err = m.opts.Manager.Bind(string(c.holder), "compute", m.opts.Device); err != nil {
			return fail(err)
		}
		c.self = cgo.NewHandle(allocator(c))
	}
	loadMu.Lock()
	lastError()
	c.abort = (*C.int)(C.calloc(1, C.size_t(unsafe.Sizeof(C.int(0)))))
	c.allocCtx = ctx
	c.c = C.memgen_llama_context_new(m.c, C.uint32_t(opts.NCtx*opts.Sequences), C.uint32_t(c.batch), C.uint32_t(c.ubatch), C.uint32_t(opts.Sequences),
		C.int32_t(m.opts.Threads), c.abort, C.uintptr_t(c.self))
	c.allocCtx = nil
	msg, allocErr := lastError(), c.allocErr
	c.allocErr = nil
	loadMu.Unlock()
	if c.c == nil {
		if allocErr != nil {
			return fail(fmt.Errorf("%w: %w", ErrContext, allocErr))
		}
		return fail(fmt.Errorf("%w: %s", ErrContext, msg))
	}
	if !m.opts.Stock {
		for _, b := range c.bufs {
			c.tensors = append(c.tensors, b.tensors...)
		}
		if len(c.tensors) == 0 {
			return fail(fmt.Errorf("%w: llama.cpp placed no KV tensor in memgen's buffers", ErrContext))
		}
		// One sequence at its longest: each tensor's stream of it.
		var full memapi.Bytes
		for _, t := range c.tensors {
			full += t.stride
		}
		// What llama.cpp reserved, checked as checkContext estimated it
		// (per sequence: the reservation of them all may exceed the
		// capacity, as growing regions are for).
		if weights, compute, capacity := m.WeightBytes(), c.compute(), c.capacity(); weights+compute+full > capacity {
			C.memgen_llama_context_free(c.c)
			c.c = nil
			return fail(&OverBudgetError{Context: string(c.holder), Rows: c.nCtx, Wanted: full, Weights: weights, Compute: compute, Capacity: capacity, Free: c.free()})
		}
	}
	return c, nil
}

// maxSequences is llama.cpp's LLAMA_MAX_SEQ; seqPad the multiple it pads
// each stream of a non-unified cache to.
const (
	maxSequences = 256
	seqPad       = 256
)

// Holder is the context's governor holder ("" with Options.Stock).
func (c *Context) Holder() governor.HolderID { return c.holder }

// NCtx is the context's size in cells.
func (c *Context) NCtx() int { return c.nCtx }

func (c *Context) authority() memapi.AuthorityID {
	a, _ := c.bind.Authority()
	return a
}

// capacity is the most the context's authority can grow to (its
// capacity, or the Model's Limit).
func (c *Context) capacity() memapi.Bytes {
	s, _ := c.m.opts.Governor.Authority(c.authority())
	return c.m.limit(s.Capacity)
}

func (c *Context) free() memapi.Bytes {
	s, _ := c.m.opts.Governor.Authority(c.authority())
	return s.Free
}

func (c *Context) setAllocErr(err error) {
	if c.allocErr == nil {
		c.allocErr = err
	}
}

// allocBuffer makes a buffer llama.cpp asks for while it creates the
// context (KV, compute and output buffers) or decodes (a compute or output
// buffer it grows; c.mu is held by the Decode).
func (c *Context) allocBuffer(size memapi.Bytes, host bool) (buffer, error) {
	if host {
		ctx := c.allocCtx
		if ctx == nil {
			ctx = context.Background()
		}
		buf, err := c.work.Allocate(ctx, max(size, 1))
		if err != nil {
			c.setAllocErr(err)
			return nil, err
		}
		h := &hostBuffer{c: c, buf: buf}
		c.host = append(c.host, h)
		return h, nil
	}
	r, err := c.bind.ReserveVirtual(context.Background(), max(size, 1))
	if err != nil {
		c.setAllocErr(err)
		return nil, err
	}
	b := &kvBuffer{c: c, reserve: r}
	c.bufs = append(c.bufs, b)
	return b, nil
}

// freeKV runs in llama_free (or a failed creation): every region of the
// buffer is closed, released behind its recorded fences.
func (c *Context) freeKV(b *kvBuffer) {
	b.mu.Lock()
	ts := b.tensors
	b.tensors = nil
	b.mu.Unlock()
	for _, t := range ts {
		_ = t.region.Close() // a failed free is quarantined by pmm; release reports it
		c.freed = append(c.freed, t.region)
	}
	_ = b.reserve.Close()
	c.freed = append(c.freed, b.reserve)
}

// freeHost runs in llama_free, or in a decode that replaces a compute or
// output buffer: no computation uses it any more (the CPU backend is
// synchronous), it is freed at once.
func (c *Context) freeHost(h *hostBuffer) {
	c.host = slices.DeleteFunc(c.host, func(x *hostBuffer) bool { return x == h })
	_ = h.buf.Close() // a failed free is quarantined by pmm; release reports it
	c.hostFreed = append(c.hostFreed, h.buf)
}

// Compute is the bytes of the context's compute and output buffers
// (llama.cpp's activations and logits), charged to its holder beside its
// KV cache (0 with Options.Stock, whose buffers llama.cpp allocates
// itself).
func (c *Context) Compute() memapi.Bytes {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.compute()
}

func (c *Context) compute() memapi.Bytes {
	var n memapi.Bytes
	for _, h := range c.host {
		n += h.buf.Size()
	}
	return n
}

// KV is a context's KV cache as its regions hold it.
type KV struct {
	Cells     int          // cells in use (rows per tensor, every sequence's together)
	Tensors   int          // KV tensors, each a region
	RowBytes  memapi.Bytes // bytes of one row of every tensor together
	Committed memapi.Bytes // committed bytes of all the regions
	Reserved  memapi.Bytes // reserved bytes of all the regions (n_ctx rows)
}

// KV reports the context's KV regions.
func (c *Context) KV() KV {
	c.mu.Lock()
	defer c.mu.Unlock()
	kv := KV{Cells: c.cells(), Tensors: len(c.tensors)}
	for _, t := range c.tensors {
		kv.RowBytes += t.rowBytes
		kv.Committed += t.region.Committed()
		kv.Reserved += t.region.Cap()
	}
	return kv
}

// Granularity is the regions' commit granularity (0 with Options.Stock).
func (c *Context) Granularity() memapi.Bytes {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tensors) == 0 {
		return 0
	}
	return c.tensors[0].region.Granularity()
}

// Stats returns the context's counters.
func (c *Context) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Tokens returns sequence 0 so far (every token decoded, and the ones a
// preemption dropped, which the next Decode recomputes).
func (c *Context) Tokens() []int32 { return c.SeqTokens(0) }

// SeqTokens returns sequence seq so far (nil for a sequence outside the
// context's).
func (c *Context) SeqTokens(seq int) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq < 0 || seq >= len(c.seqs) {
		return nil
	}
	return append([]int32(nil), c.seqs[seq].tokens...)
}

// Sequences is how many sequences the context decodes together.
func (c *Context) Sequences() int { return len(c.seqs) }

// Decode appends tokens to sequence 0, decodes them and returns the
// greedy next token (the argmax of the last token's logits): DecodeBatch
// with one entry.
func (c *Context) Decode(ctx context.Context, tokens []int32) (int32, error) {
	next, err := c.DecodeBatch(ctx, []SeqTokens{{Seq: 0, Tokens: tokens}})
	if err != nil {
		return 0, err
	}
	return next[0], nil
}

// SeqTokens are tokens to append to one sequence of a context.
type SeqTokens struct {
	Seq    int // 0 ... Sequences-1
	Tokens []int32
	// Sampler draws the token after the last of Tokens; nil takes the
	// greedy one (the argmax of its logits).
	Sampler *Sampler
	// Top, when set, receives the greedy token's logit and the
	// runner-up's (with Sampler set: Second -1).
	Top *TopLogits
}

// TopLogits are the two highest logits of a greedy choice: the chosen
// token's, and the runner-up token's. Their difference is the choice's
// margin: how far the logits must move for another token to be chosen
// (batches of other shapes can round llama.cpp's sums differently).
type TopLogits struct {
	Logit       float32 // the chosen token's
	Second      int32   // the runner-up, -1 for a sampled token
	SecondLogit float32 // its logit
}

// seqState is one sequence of a context: its tokens, and the cells
// llama.cpp holds of them (a prefix of them: fewer after a preemption).
type seqState struct {
	tokens []int32
	cells  int
	// moved is, per KV tensor, the host copy of the sequence's rows while
	// a preemption keeps them in the host tier (nil: resident; a nil entry,
	// a tensor with no row of it); its cells stay llama.cpp's.
	moved []*pmm.Offloaded
	// finished: the caller said so (FinishSeq) and has not decoded into it
	// since; a level-2 sleep discards its cells.
	finished bool
}

// running reports whether a level-2 sleep must keep the sequence's KV
// cache: it holds cells on the device and is not finished.
func (sq seqState) running() bool { return sq.cells > 0 && !sq.finished && sq.moved == nil }

// DecodeBatch appends each entry's tokens to its sequence, decodes them all
// together (each sequence in its own KV stream, one llama_decode for up to
// Batch tokens of them) and returns, per entry, the greedy next token after
// its last. A named sequence a preemption offloaded is copied back from
// the host tier first, and one it dropped has its earlier tokens decoded
// again first; the sequences the call does not name stay as they are.
// Before anything is restored or grown, the bytes the call will commit
// are reserved (and given back at once): when they are short, the
// context may give up sequences the call does not name (Reclaim). Before
// the first llama_decode every sequence's KV ranges grow once to the rows
// the whole call uses, and after the last they hold exactly its cells.
// When the governor refuses within ctx, DecodeBatch
// fails with an *OverBudgetError (a *WaitError when ctx ended) and every
// sequence is as before. A sequence outside the context's, or named twice,
// is memapi.ErrInvalidRange; an entry without tokens memapi.ErrInvalidSize;
// a token outside the vocabulary ErrToken; a sequence longer than NCtx
// ErrContextFull; a closed context memapi.ErrClosed.
func (c *Context) DecodeBatch(ctx context.Context, in []SeqTokens) ([]int32, error) {
	const op = "llamacpp.Context.DecodeBatch"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, memapi.Errorf(op, memapi.ErrClosed, "context %s was closed", c.holder)
	}
	if c.asleep {
		return nil, fmt.Errorf("%s: context %s: %w", op, c.holder, ErrAsleep)
	}
	if len(in) == 0 {
		return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "no sequences")
	}
	seen := make(map[int]bool, len(in))
	for _, e := range in {
		if e.Seq < 0 || e.Seq >= len(c.seqs) || seen[e.Seq] {
			return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "sequence %d (the context has %d; each at most once a call)", e.Seq, len(c.seqs))
		}
		seen[e.Seq] = true
		if len(e.Tokens) == 0 {
			return nil, memapi.Errorf(op, memapi.ErrInvalidSize, "no tokens for sequence %d", e.Seq)
		}
		if e.Sampler != nil && e.Sampler.p == nil {
			return nil, memapi.Errorf(op, memapi.ErrClosed, "the sampler of sequence %d was closed", e.Seq)
		}
		for _, t := range e.Tokens {
			if t < 0 || int(t) >= c.m.nVocab {
				return nil, fmt.Errorf("%w: %d (vocabulary of %d)", ErrToken, t, c.m.nVocab)
			}
		}
		if n := len(c.seqs[e.Seq].tokens) + len(e.Tokens); n > c.nCtx {
			return nil, fmt.Errorf("%w: %d tokens in sequence %d of a context of %d", ErrContextFull, n, e.Seq, c.nCtx)
		}
	}
	// Per sequence, the tokens a preemption dropped first, then the new
	// ones; the rows the call touches.
	type work struct {
		seq       int
		hist      int // the sequence's tokens before the call
		todo      []int32
		recompute int
		rows      int // its cells after the call
		commit    int // the rows the call touches
	}
	ws := make([]work, len(in))
	for i, e := range in {
		sq := &c.seqs[e.Seq]
		w := work{seq: e.Seq, hist: len(sq.tokens), todo: e.Tokens, recompute: len(sq.tokens) - sq.cells}
		if w.recompute > 0 {
			w.todo = slices.Concat(sq.tokens[sq.cells:], e.Tokens)
		}
		w.rows = sq.cells + len(w.todo)
		w.commit = w.rows
		if len(c.tensors) > 0 && !untiled {
			w.commit = touched(sq.cells, len(w.todo), c.ubatch, c.tensors[0].cells)
		}
		ws[i] = w
	}
	want := make(map[int]int, len(ws))
	for _, w := range ws {
		want[w.seq] = w.commit
	}
	// Room first (a sequence the call does not name may be given up for
	// it), then the sequences a preemption offloaded come back, then the
	// growth.
	if need := c.roomNeeded(seen, want); need > 0 {
		if err := c.makeRoom(ctx, need, seen, want); err != nil {
			return nil, err
		}
	}
	for _, w := range ws {
		if err := c.restoreSeq(ctx, op, w.seq); err != nil {
			return nil, err
		}
	}
	if err := c.grow(ctx, want); err != nil {
		return nil, err
	}
	// The call's fence, on every region (stock has none): a release of
	// the regions waits for the last of its decodes. It is completed once
	// they returned, before the call shrinks the ranges it grew (a region
	// queues each release behind the fence, and its next transaction
	// behind that release: a second decommit under an open fence would
	// wait for the call that makes it).
	f := newDecodeFence()
	defer f.complete()
	for _, t := range c.tensors {
		if err := t.region.RecordUse(f); err != nil {
			f.complete()
			return nil, errors.Join(err, c.shrinkToCells())
		}
	}
	// undo leaves every sequence as before: cells of this call's tokens
	// already decoded are dropped again (recomputed ones stay, the next
	// call goes on from them), and the ranges hold the cells again.
	undo := func(err error) error {
		f.complete()
		for _, w := range ws {
			if sq := &c.seqs[w.seq]; sq.cells > w.hist {
				if !C.memgen_llama_seq_rm(c.c, C.llama_seq_id(w.seq), C.llama_pos(w.hist)) {
					err = errors.Join(err, fmt.Errorf("%w: llama_memory_seq_rm refused", ErrDecode))
				}
				sq.cells = w.hist
			}
		}
		return errors.Join(err, c.shrinkToCells())
	}
	// The batch: the sequences' tokens one after the other, cut every
	// Batch tokens; each sequence's last token is an output.
	var b decodeInput
	for i, w := range ws {
		cells := c.seqs[w.seq].cells
		for j, t := range w.todo {
			var smp *C.struct_llama_sampler
			if j == len(w.todo)-1 && in[i].Sampler != nil {
				smp = in[i].Sampler.p
			}
			b.add(t, cells+j, w.seq, j == len(w.todo)-1, smp)
		}
	}
	next := make([]int32, 0, len(ws))
	tops := make([]TopLogits, 0, len(ws))
	defer c.abortOn(ctx)()
	for from := 0; from < len(b.tokens); from += c.batch {
		if ctx.Err() != nil {
			return nil, undo(fmt.Errorf("llamacpp: decode stopped between batches: %w", context.Cause(ctx)))
		}
		part := b.slice(from, min(from+c.batch, len(b.tokens)))
		out, top, err := c.decodeBatch(ctx, part)
		if err != nil {
			return nil, undo(err)
		}
		next = append(next, out...)
		tops = append(tops, top...)
	}
	for _, w := range ws {
		c.stats.Recomputed += w.recompute
	}
	f.complete()
	if err := c.shrinkToCells(); err != nil {
		return nil, undo(fmt.Errorf("llamacpp: decoded, but the tile's rows above the cells could not be released: %w", err))
	}
	for i, e := range in {
		sq := &c.seqs[e.Seq]
		sq.tokens = append(sq.tokens, e.Tokens...)
		sq.finished = false
		if e.Top != nil {
			*e.Top = tops[i]
		}
	}
	return next, nil
}

// decodeInput is a batch for llama_decode: per token its id, position,
// sequence, whether its logits are read, and the sampler that draws the
// token after it (nil: greedy).
type decodeInput struct {
	tokens []C.llama_token
	pos    []C.llama_pos
	seq    []C.llama_seq_id
	out    []C.int8_t
	smp    []*C.struct_llama_sampler
}

func (b *decodeInput) add(t int32, pos, seq int, out bool, smp *C.struct_llama_sampler) {
	o := C.int8_t(0)
	if out {
		o = 1
	}
	b.tokens = append(b.tokens, C.llama_token(t))
	b.pos = append(b.pos, C.llama_pos(pos))
	b.seq = append(b.seq, C.llama_seq_id(seq))
	b.out = append(b.out, o)
	b.smp = append(b.smp, smp)
}

func (b *decodeInput) slice(from, to int) decodeInput {
	return decodeInput{tokens: b.tokens[from:to], pos: b.pos[from:to], seq: b.seq[from:to], out: b.out[from:to], smp: b.smp[from:to]}
}

// samplers is the sampler of each output, in order (C memory, as the
// bridge reads it after the decode; freed by the caller).
func (b *decodeInput) samplers() **C.struct_llama_sampler {
	n := max(b.outputs(), 1)
	arr := (*[1 << 20]*C.struct_llama_sampler)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof((*C.struct_llama_sampler)(nil)))))[:n:n]
	k := 0
	for i, o := range b.out {
		if o != 0 {
			arr[k] = b.smp[i]
			k++
		}
	}
	return &arr[0]
}

func (b *decodeInput) outputs() int {
	n := 0
	for _, o := range b.out {
		n += int(o)
	}
	return n
}

// kvTile is the rows of K and V that ggml's CPU flash-attention kernel
// reads together when it computes a ubatch of 64 tokens or more (its tiled
// path, taken for GGML_FA_TILE_Q = 64 queries or more; GGML_FA_TILE_KV =
// 64 rows): it reads every row of a tile in which one cell is visible to
// one query. Below 64 tokens it reads exactly the visible rows. See
// docs/llamacpp.md.
const kvTile = 64

// touched is the rows of each KV tensor that decoding n tokens after cells
// cells touches, computed in ubatches of at most ubatch tokens: the cells
// it writes and reads, and when its first ubatch (the largest) holds 64
// tokens or more, the rest of the last 64-row tile (at most the tensor's
// rows; an earlier tiled ubatch reads no further than the last tile).
func touched(cells, n, ubatch, rows int) int {
	r := cells + n
	if min(n, ubatch) >= kvTile {
		r = min((r+kvTile-1)/kvTile*kvTile, rows)
	}
	return r
}

// abortOn makes the llama_decode calls of a Decode stop once ctx ends:
// then (context.AfterFunc: no goroutine until it ends) the context's abort
// flag is set, which llama.cpp's abort callback reads between the graph's
// nodes. The returned stop waits for a setting under way and clears the
// flag.
func (c *Context) abortOn(ctx context.Context) (stop func()) {
	if ctx.Done() == nil || c.abort == nil {
		return func() {}
	}
	set := make(chan struct{})
	cancel := context.AfterFunc(ctx, func() {
		C.memgen_llama_set_flag(c.abort, 1)
		if abortSet != nil {
			abortSet()
		}
		close(set)
	})
	return func() {
		if !cancel() {
			<-set
		}
		C.memgen_llama_set_flag(c.abort, 0)
	}
}

// beforeLlamaDecode runs before each llama_decode, and abortSet once a
// Decode's abort flag is set (tests only: they end a context while
// llama_decode runs).
var beforeLlamaDecode, abortSet func()

// decodeBatch decodes one batch (at most Batch tokens) whose rows are
// committed and returns the next token after each of its outputs, with
// its top logits. A decode that ctx's end aborted keeps none of the
// batch's cells (llama.cpp keeps the ubatches it finished: they are
// removed).
func (c *Context) decodeBatch(ctx context.Context, b decodeInput) ([]int32, []TopLogits, error) {
	next := make([]C.llama_token, max(b.outputs(), 1))
	second := make([]C.llama_token, len(next))
	top := make([]C.float, 2*len(next))
	if beforeLlamaDecode != nil {
		beforeLlamaDecode()
	}
	smp := b.samplers()
	defer C.free(unsafe.Pointer(smp))
	c.allocCtx = ctx
	st := C.memgen_llama_decode(c.c, C.int32_t(len(b.tokens)), &b.tokens[0], &b.pos[0], &b.seq[0], &b.out[0], smp,
		C.int32_t(c.m.nVocab), &next[0], &top[0], &second[0], C.uintptr_t(c.self))
	c.allocCtx = nil
	allocErr := c.allocErr
	c.allocErr = nil
	c.stats.Decodes++
	if st == 2 && ctx.Err() != nil {
		var errs []error
		for _, seq := range distinct(b.seq) {
			if !C.memgen_llama_seq_rm(c.c, C.llama_seq_id(seq), C.llama_pos(c.seqs[seq].cells)) {
				errs = append(errs, fmt.Errorf("%w: aborted, and llama_memory_seq_rm refused the cells of sequence %d: %w", ErrDecode, seq, context.Cause(ctx)))
			}
		}
		if len(errs) > 0 {
			return nil, nil, errors.Join(errs...)
		}
		return nil, nil, fmt.Errorf("llamacpp: llama_decode aborted: %w", context.Cause(ctx))
	}
	if st != 0 {
		// llama.cpp changed nothing.
		if allocErr != nil {
			return nil, nil, fmt.Errorf("%w: llama_decode returned %d: a buffer it grows: %w", ErrDecode, int32(st), allocErr)
		}
		return nil, nil, fmt.Errorf("%w: llama_decode returned %d: %s", ErrDecode, int32(st), lastError())
	}
	for _, seq := range b.seq {
		c.seqs[seq].cells++
	}
	c.stats.Tokens += len(b.tokens)
	out := make([]int32, b.outputs())
	tops := make([]TopLogits, len(out))
	for i := range out {
		out[i] = int32(next[i])
		tops[i] = TopLogits{Logit: float32(top[2*i]), Second: int32(second[i]), SecondLogit: float32(top[2*i+1])}
	}
	return out, tops, nil
}

// distinct returns the sequences of a batch, each once.
func distinct(seqs []C.llama_seq_id) []int {
	var out []int
	for _, s := range seqs {
		if !slices.Contains(out, int(s)) {
			out = append(out, int(s))
		}
	}
	return out
}

// shrinkToCells shrinks every resident sequence's ranges to its cells
// (released behind the fences).
func (c *Context) shrinkToCells() error {
	var errs []error
	for _, t := range c.tensors {
		for s := range c.seqs {
			if c.seqs[s].moved != nil {
				continue
			}
			errs = append(errs, t.resize(context.Background(), s, c.seqs[s].cells))
		}
	}
	return errors.Join(errs...)
}

// rowsShort is subtracted from the rows grow commits, and untiled drops
// the tile rounding of a batch: both are unset but in the tests that show
// an uncommitted row faults (TestOneRowShortFaults,
// TestPrefillNeedsWholeTiles).
var (
	rowsShort int
	untiled   bool
)

// grow commits, per sequence in rows, every tensor's rows of it up to
// rows[seq]. On a refusal the ranges grown so far are shrunk back: each
// holds its sequence's cells again.
func (c *Context) grow(ctx context.Context, rows map[int]int) error {
	if len(c.tensors) == 0 {
		return nil
	}
	seqs := make([]int, 0, len(rows))
	for s := range rows {
		seqs = append(seqs, s)
	}
	slices.Sort(seqs)
	grew := false
	start := time.Now()
	for _, t := range c.tensors {
		for _, s := range seqs {
			want, _ := memapi.RoundUp(memapi.Bytes(rows[s]-rowsShort)*t.rowBytes, t.region.Granularity())
			if want <= t.backed[s] {
				continue
			}
			grew = true
			if err := t.resize(ctx, s, rows[s]-rowsShort); err != nil {
				back := c.shrinkToCells()
				return errors.Join(c.growError(ctx, rows, err), back)
			}
		}
	}
	if grew {
		c.stats.Grows++
		c.stats.GrowTime += time.Since(start)
	}
	return nil
}

// growError is the error of a growth to rows refused with err: a
// *WaitError when the caller's context ended, else an *OverBudgetError.
func (c *Context) growError(ctx context.Context, rows map[int]int, err error) error {
	var kv, wanted memapi.Bytes
	most := 0
	for _, u := range c.tensors {
		kv += u.region.Committed()
		for _, r := range rows {
			wanted += memapi.Bytes(r) * u.rowBytes
			most = max(most, r)
		}
	}
	if cause := context.Cause(ctx); cause != nil {
		// The wait ended with the caller's context: that is what
		// happened, not a refusal of the budget.
		return &WaitError{Context: string(c.holder), Rows: most, Wanted: wanted, Committed: kv, Free: c.free(), Err: cause}
	}
	return &OverBudgetError{Context: string(c.holder), Rows: most, Wanted: wanted, Committed: kv,
		Capacity: c.capacity(), Free: c.free(), Err: err}
}

// Reset drops every sequence: llama.cpp's cells, then the regions'
// backing (released behind the decode fences, refunded) and the host
// copies of the sequences a preemption offloaded.
func (c *Context) Reset(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resetLocked(ctx, "llamacpp.Context.Reset", nil)
}

// ResetSeq drops sequence seq (a finished one): its cells, then its
// ranges' backing, behind the decode fences (or its host copies, when a
// preemption offloaded it); the other sequences are not
// touched, and the next DecodeBatch that names seq starts it afresh. A
// sequence outside the context's is memapi.ErrInvalidRange.
func (c *Context) ResetSeq(ctx context.Context, seq int) error {
	const op = "llamacpp.Context.ResetSeq"
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq < 0 || seq >= len(c.seqs) {
		return memapi.Errorf(op, memapi.ErrInvalidRange, "sequence %d (the context has %d)", seq, len(c.seqs))
	}
	return c.resetLocked(ctx, op, []int{seq})
}

// FinishSeq says that sequence seq is finished for now: its cells stay,
// and a DecodeBatch that names it again continues it (it runs again), but
// a level-2 sleep (Model.SleepLevel) discards them instead of keeping them
// (its tokens are kept, and the next call that names it recomputes them,
// as after a preemption). A sequence is running from the DecodeBatch that
// names it until FinishSeq or ResetSeq. A sequence outside the context's
// is memapi.ErrInvalidRange; a closed context memapi.ErrClosed.
func (c *Context) FinishSeq(seq int) error {
	const op = "llamacpp.Context.FinishSeq"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return memapi.Errorf(op, memapi.ErrClosed, "context %s was closed", c.holder)
	}
	if seq < 0 || seq >= len(c.seqs) {
		return memapi.Errorf(op, memapi.ErrInvalidRange, "sequence %d (the context has %d)", seq, len(c.seqs))
	}
	c.seqs[seq].finished = true
	return nil
}

// dropFinished discards the cells of the finished sequences (c.mu held,
// the model's sleep turn taken): llama.cpp's cells, then their ranges'
// backing, behind the decode fences, as a preemption does; their tokens
// stay. A sequence a preemption moved to the host tier is left as it is.
// On a failure the sequences' cells are gone and their ranges hold what
// they could not release: the next decode shrinks them.
func (c *Context) dropFinished(ctx context.Context) error {
	if c.closed {
		return nil
	}
	var seqs []int
	for s, sq := range c.seqs {
		if sq.finished && sq.cells > 0 && sq.moved == nil {
			if !C.memgen_llama_seq_rm(c.c, C.llama_seq_id(s), 0) {
				return fmt.Errorf("%w: llama_memory_seq_rm refused sequence %d", ErrDecode, s)
			}
			c.seqs[s].cells = 0
			seqs = append(seqs, s)
		}
	}
	for _, t := range c.tensors {
		for _, s := range seqs {
			if t.backed[s] == 0 {
				continue
			}
			if err := faultAt("decommit KV " + t.name); err != nil {
				return err
			}
			if err := t.resize(ctx, s, 0); err != nil {
				return fmt.Errorf("%s of sequence %d: %w", t.name, s, err)
			}
		}
	}
	return nil
}

// running reports whether a sequence of the context is running.
func (c *Context) running() bool {
	return slices.ContainsFunc(c.seqs, seqState.running)
}

// resetLocked drops the sequences in seqs (every one for nil).
func (c *Context) resetLocked(ctx context.Context, op string, seqs []int) error {
	if c.closed {
		return memapi.Errorf(op, memapi.ErrClosed, "context %s was closed", c.holder)
	}
	if c.asleep {
		return fmt.Errorf("%s: context %s: %w", op, c.holder, ErrAsleep)
	}
	if seqs == nil {
		for s := range c.seqs {
			seqs = append(seqs, s)
		}
	}
	var errs []error
	for _, s := range seqs {
		if _, err := c.dropSeq(ctx, s); err != nil {
			if c.seqs[s].cells > 0 { // llama.cpp kept them: nothing changed
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
		}
		c.seqs[s] = seqState{tokens: c.seqs[s].tokens[:0]}
	}
	return errors.Join(errs...)
}

// cells is the cells llama.cpp holds, every sequence's together.
func (c *Context) cells() int {
	n := 0
	for _, sq := range c.seqs {
		n += sq.cells
	}
	return n
}

// Close frees the context: llama_free releases its KV regions behind their
// fences; Close waits (bounded by ctx) for the refunds, then unregisters
// the holder. A second Close fails with memapi.ErrClosed.
func (c *Context) Close(ctx context.Context) error {
	const op = "llamacpp.Context.Close"
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrClosed, "context %s was closed", c.holder)
	}
	c.closed = true
	C.memgen_llama_context_free(c.c)
	c.c = nil
	offs := c.sleeping // the KV cache's host copies go with it
	for s := range c.seqs {
		for _, o := range c.seqs[s].moved {
			if o != nil {
				offs = append(offs, o)
			}
		}
		c.seqs[s].moved = nil
	}
	drop := dropSleeping(offs)
	c.sleeping, c.asleep = nil, false
	c.mu.Unlock()
	c.m.mu.Lock()
	delete(c.m.contexts, c)
	c.m.mu.Unlock()
	return errors.Join(drop, c.release(ctx))
}

// release waits for the regions' refunds and ends the binding and the
// holder.
func (c *Context) release(ctx context.Context) error {
	if c.abort != nil { // llama.cpp's context, which read it, is freed
		C.free(unsafe.Pointer(c.abort))
		c.abort = nil
	}
	if c.m.opts.Stock {
		return nil
	}
	if err := waitReleased(ctx, c.freed...); err != nil {
		return err
	}
	if err := waitReleased(ctx, c.hostFreed...); err != nil {
		return err
	}
	c.freed, c.hostFreed = nil, nil
	if c.self != 0 {
		c.self.Delete()
		c.self = 0
	}
	var errs []error
	for _, b := range []*pmm.Binding{c.bind, c.work} {
		if b != nil {
			errs = append(errs, b.Close())
		}
	}
	if c.holder != "" {
		errs = append(errs, c.m.opts.Governor.Unregister(c.holder))
	}
	return errors.Join(errs...)
}
