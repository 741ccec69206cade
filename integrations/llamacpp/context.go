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
	// NCtx is the context's size in cells (tokens); every KV tensor is
	// reserved for it. Required.
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
	// Priority is the context's holder's priority: under pressure the
	// governor asks lower priorities first.
	Priority governor.Priority
	// NoFlashAttention asks for llama.cpp's attention without flash
	// attention. It is refused (memapi.ErrUnsupported) at NewContext:
	// without it llama.cpp stores V transposed, one row of n_ctx per
	// channel, so a growing region would be touched whole by the first
	// token, and its kernels read cells past the live ones.
	NoFlashAttention bool
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
	tokens    []int32       // the sequence: its cells are tokens[:cells]
	cells     int           // cells in llama.cpp's cache (0 after a preemption)
	stats     Stats
}

// Stats are a context's counters.
type Stats struct {
	Decodes     int           // llama_decode calls
	Tokens      int           // tokens decoded, recomputed ones included
	Grows       int           // decodes that had to grow the regions
	GrowTime    time.Duration // time spent growing (governor and commit)
	Preemptions int           // times the holder gave its KV cache up
	Recomputed  int           // tokens decoded again after preemptions
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
	if opts.NoFlashAttention {
		return nil, memapi.Errorf(op, memapi.ErrUnsupported, "a context without flash attention: its V cache is one row of n_ctx per channel, which a growing region cannot back")
	}
	if err := m.checkContext(opts.NCtx); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, memapi.Errorf(op, memapi.ErrClosed, "model %s was closed", m.path)
	}
	m.nextID++
	c := &Context{m: m, nCtx: opts.NCtx, batch: min(opts.Batch, opts.NCtx)}
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
	c.c = C.memgen_llama_context_new(m.c, C.uint32_t(opts.NCtx), C.uint32_t(c.batch), C.uint32_t(c.ubatch), C.int32_t(m.opts.Threads), c.abort, C.uintptr_t(c.self))
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
		var full memapi.Bytes
		for _, t := range c.tensors {
			full += t.region.Cap()
		}
		// What llama.cpp reserved, checked as checkContext estimated it.
		if weights, compute, capacity := m.WeightBytes(), c.compute(), c.capacity(); weights+compute+full > capacity {
			C.memgen_llama_context_free(c.c)
			c.c = nil
			return fail(&OverBudgetError{Context: string(c.holder), Rows: c.nCtx, Wanted: full, Weights: weights, Compute: compute, Capacity: capacity, Free: c.free()})
		}
	}
	return c, nil
}

// Holder is the context's governor holder ("" with Options.Stock).
func (c *Context) Holder() governor.HolderID { return c.holder }

// NCtx is the context's size in cells.
func (c *Context) NCtx() int { return c.nCtx }

func (c *Context) authority() memapi.AuthorityID {
	a, _ := c.bind.Authority()
	return a
}

func (c *Context) capacity() memapi.Bytes {
	s, _ := c.m.opts.Governor.Authority(c.authority())
	return s.Capacity
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
	Cells     int          // cells (rows per tensor) in use
	Tensors   int          // KV tensors, each a region
	RowBytes  memapi.Bytes // bytes of one row of every tensor together
	Committed memapi.Bytes // committed bytes of all the regions
	Reserved  memapi.Bytes // reserved bytes of all the regions (n_ctx rows)
}

// KV reports the context's KV regions.
func (c *Context) KV() KV {
	c.mu.Lock()
	defer c.mu.Unlock()
	kv := KV{Cells: c.cells, Tensors: len(c.tensors)}
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

// Tokens returns the sequence so far (every token decoded, and the ones a
// preemption dropped, which the next Decode recomputes).
func (c *Context) Tokens() []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int32(nil), c.tokens...)
}

// Decode appends tokens to the sequence, decodes them and returns the
// greedy next token (the argmax of the last token's logits). After a
// preemption the sequence's earlier tokens are decoded again first. The
// tokens are decoded in batches of Batch tokens (one llama_decode each);
// before the first, the KV regions grow once to the rows the whole call
// uses, and after the last they hold exactly its cells. When the governor
// refuses within ctx, Decode fails with an *OverBudgetError and the
// sequence is as before. A token outside the vocabulary is ErrToken, a
// sequence longer than NCtx ErrContextFull, a closed context
// memapi.ErrClosed.
func (c *Context) Decode(ctx context.Context, tokens []int32) (int32, error) {
	const op = "llamacpp.Context.Decode"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, memapi.Errorf(op, memapi.ErrClosed, "context %s was closed", c.holder)
	}
	if len(tokens) == 0 {
		return 0, memapi.Errorf(op, memapi.ErrInvalidSize, "no tokens")
	}
	for _, t := range tokens {
		if t < 0 || int(t) >= c.m.nVocab {
			return 0, fmt.Errorf("%w: %d (vocabulary of %d)", ErrToken, t, c.m.nVocab)
		}
	}
	if n := len(c.tokens) + len(tokens); n > c.nCtx {
		return 0, fmt.Errorf("%w: %d tokens in a context of %d", ErrContextFull, n, c.nCtx)
	}
	// The tokens a preemption dropped first, then the new ones.
	hist := len(c.tokens)
	todo := tokens
	recompute := hist - c.cells
	if recompute > 0 {
		todo = slices.Concat(c.tokens[c.cells:], tokens)
	}
	rows := c.cells + len(todo)
	commit := rows
	if len(c.tensors) > 0 && !untiled {
		commit = touched(c.cells, len(todo), c.ubatch, c.tensors[0].cells)
	}
	if err := c.grow(ctx, commit); err != nil {
		return 0, err
	}
	// The call's fence, on every region (stock has none): a release of
	// the regions waits for the last of its decodes.
	var f *decodeFence
	if len(c.tensors) > 0 {
		f = newDecodeFence()
		defer f.complete()
		for _, t := range c.tensors {
			if err := t.region.RecordUse(f); err != nil {
				return 0, errors.Join(err, c.shrinkTo(c.cells))
			}
		}
	}
	// undo leaves the sequence as before: cells of this call's tokens
	// already decoded are dropped again (recomputed ones stay, the next
	// Decode goes on from them), and the regions hold the cells again.
	undo := func(err error) error {
		if c.cells > hist {
			if !C.memgen_llama_seq_rm(c.c, C.llama_pos(hist)) {
				err = errors.Join(err, fmt.Errorf("%w: llama_memory_seq_rm refused", ErrDecode))
			}
			c.cells = hist
		}
		return errors.Join(err, c.shrinkTo(c.cells))
	}
	var next int32
	defer c.abortOn(ctx)()
	for len(todo) > 0 {
		if ctx.Err() != nil {
			return 0, undo(fmt.Errorf("llamacpp: decode stopped between batches: %w", context.Cause(ctx)))
		}
		n := min(len(todo), c.batch)
		var err error
		next, err = c.decodeBatch(ctx, todo[:n])
		if err != nil {
			return 0, undo(err)
		}
		c.stats.Recomputed += min(n, recompute)
		recompute -= min(n, recompute)
		todo = todo[n:]
	}
	if commit > rows {
		if err := c.shrinkTo(rows); err != nil {
			return 0, undo(fmt.Errorf("llamacpp: decoded, but the tile's rows above the cells could not be released: %w", err))
		}
	}
	c.tokens = append(c.tokens, tokens...)
	return next, nil
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
// committed. A decode that ctx's end aborted keeps none of the batch's
// cells (llama.cpp keeps the ubatches it finished: they are removed).
func (c *Context) decodeBatch(ctx context.Context, batch []int32) (int32, error) {
	var next C.llama_token
	if beforeLlamaDecode != nil {
		beforeLlamaDecode()
	}
	c.allocCtx = ctx
	st := C.memgen_llama_decode(c.c, (*C.llama_token)(&batch[0]), C.int32_t(len(batch)), C.int32_t(c.m.nVocab), &next, C.uintptr_t(c.self))
	c.allocCtx = nil
	allocErr := c.allocErr
	c.allocErr = nil
	c.stats.Decodes++
	if st == 2 && ctx.Err() != nil {
		if !C.memgen_llama_seq_rm(c.c, C.llama_pos(c.cells)) {
			return 0, fmt.Errorf("%w: aborted, and llama_memory_seq_rm refused its cells: %w", ErrDecode, context.Cause(ctx))
		}
		return 0, fmt.Errorf("llamacpp: llama_decode aborted: %w", context.Cause(ctx))
	}
	if st != 0 {
		// llama.cpp changed nothing.
		if allocErr != nil {
			return 0, fmt.Errorf("%w: llama_decode returned %d: a buffer it grows: %w", ErrDecode, int32(st), allocErr)
		}
		return 0, fmt.Errorf("%w: llama_decode returned %d: %s", ErrDecode, int32(st), lastError())
	}
	c.cells += len(batch)
	c.stats.Tokens += len(batch)
	return int32(next), nil
}

// shrinkTo shrinks every tensor to rows (released behind the fences).
func (c *Context) shrinkTo(rows int) error {
	var errs []error
	for _, t := range c.tensors {
		if want := memapi.Bytes(rows) * t.rowBytes; want < t.region.Len() {
			errs = append(errs, t.region.Shrink(context.Background(), want, nil))
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

// grow commits every tensor's rows up to rows. On a refusal the tensors
// grown so far are shrunk back: each holds its c.cells rows again.
func (c *Context) grow(ctx context.Context, rows int) error {
	if len(c.tensors) == 0 {
		return nil
	}
	grew := false
	start := time.Now()
	for i, t := range c.tensors {
		want := memapi.Bytes(rows-rowsShort) * t.rowBytes
		if want <= t.region.Len() {
			continue
		}
		grew = true
		if err := t.region.Grow(ctx, want, nil); err != nil {
			var errs []error
			for _, u := range c.tensors[:i] {
				if back := memapi.Bytes(c.cells) * u.rowBytes; back < u.region.Len() {
					errs = append(errs, u.region.Shrink(context.Background(), back, nil))
				}
			}
			kv := memapi.Bytes(0)
			wanted := memapi.Bytes(0)
			for _, u := range c.tensors {
				kv += u.region.Committed()
				wanted += memapi.Bytes(rows) * u.rowBytes
			}
			if cause := context.Cause(ctx); cause != nil {
				// The wait ended with the caller's context: that is what
				// happened, not a refusal of the budget.
				return errors.Join(&WaitError{Context: string(c.holder), Rows: rows, Wanted: wanted, Committed: kv, Free: c.free(), Err: cause},
					errors.Join(errs...))
			}
			return errors.Join(&OverBudgetError{Context: string(c.holder), Rows: rows, Wanted: wanted, Committed: kv,
				Capacity: c.capacity(), Free: c.free(), Err: err}, errors.Join(errs...))
		}
	}
	if grew {
		c.stats.Grows++
		c.stats.GrowTime += time.Since(start)
	}
	return nil
}

// shrink drops every tensor's rows (the cells were dropped first);
// the backing is released behind the recorded fences. It returns the
// committed bytes given up.
func (c *Context) shrink(ctx context.Context) (memapi.Bytes, error) {
	var freed memapi.Bytes
	var errs []error
	for _, t := range c.tensors {
		n := t.region.Committed()
		if err := t.region.Shrink(ctx, 0, nil); err != nil {
			errs = append(errs, err)
			continue
		}
		freed += n
	}
	return freed, errors.Join(errs...)
}

// Reset drops the sequence: llama.cpp's cells, then the regions' backing
// (released behind the decode fences, refunded).
func (c *Context) Reset(ctx context.Context) error {
	const op = "llamacpp.Context.Reset"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return memapi.Errorf(op, memapi.ErrClosed, "context %s was closed", c.holder)
	}
	if !C.memgen_llama_seq_rm(c.c, 0) {
		return fmt.Errorf("%w: llama_memory_seq_rm refused", ErrDecode)
	}
	c.tokens, c.cells = c.tokens[:0], 0
	_, err := c.shrink(ctx)
	return err
}

// Reclaim is the context's answer to a pressure ticket: it preempts its
// whole sequence when it is idle (no call in progress: a context that is
// decoding, or whose own growth raised the ticket, answers 0). Preempting
// drops llama.cpp's cells and shrinks every region to nothing, released
// behind the decode fences; the sequence's tokens are kept, and the next
// Decode recomputes them. It returns the bytes given up.
func (c *Context) Reclaim(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	if !c.mu.TryLock() {
		return 0, nil
	}
	defer c.mu.Unlock()
	if c.closed || c.cells == 0 || t.Authority != c.authority() {
		return 0, nil
	}
	C.memgen_llama_clear(c.c)
	c.cells = 0
	c.stats.Preemptions++
	return c.shrink(context.Background())
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
	c.mu.Unlock()
	c.m.mu.Lock()
	delete(c.m.contexts, c)
	c.m.mu.Unlock()
	return c.release(ctx)
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
