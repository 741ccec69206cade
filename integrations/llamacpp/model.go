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

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/integrations/llamacpp/gguf"
	"github.com/memgen/memgen/pmm"
)

// Options configure LoadModel.
type Options struct {
	// Manager, Governor and Device: the pmm manager that draws from
	// Governor (pmm.New(Governor, ...)), and the host device (a CPU mechanism
	// with virtual backing) registered with it. The weights and every
	// context's KV cache are allocated there.
	Manager  *pmm.Manager
	Governor *governor.Governor
	Device   memapi.DeviceKey
	// Name prefixes the holders: Name+"/weights", Name+"/ctx<N>". Default
	// "llama".
	Name string
	// Threads is llama.cpp's thread count for decoding. Default 1.
	Threads int
	// Limit, when set, says the most the authority can grow to, when that
	// is more than its capacity: a shared ledger's capacity, for an
	// authority bound to one (xproc.Ledger.Bind), whose own capacity is
	// only what this process has claimed so far. The checks that a
	// context can ever fit beside the weights use it.
	Limit func() memapi.Bytes
	// Stock loads the model the way llama.cpp does on its own: its CPU
	// buffers (malloc), every context's KV cache allocated and cleared for
	// all of n_ctx at creation. Manager, Governor and Device are not used.
	// It is the baseline of the tests and benchmarks.
	Stock bool
	// SleepOnPressure registers the weights' holder with a Reclaim, so
	// that the governor asks it under pressure on the device's authority
	// (a local shortfall or, on a shared ledger, another process's want)
	// as it asks the contexts'. A Server with ServerOptions.SleepOnPressure
	// answers by putting the idle model to sleep; until one does, the
	// answer is 0. Without it the weights' holder is never asked (and, on a
	// shared ledger, its bytes are not offered to other processes).
	SleepOnPressure bool
	// OnMemoryEvent, when set, is told of every move of the model's bytes
	// between the device and the host tier, once it ended: each sleep and
	// wake of the model (Model.SleepLevel, Model.Wake, a Server's), and each
	// offload of a context's KV cache under pressure and its restore
	// (ContextOptions.OffloadTo). It is called in the goroutine that made
	// the move, which may hold the context's lock: it must return soon and
	// not call the model or its contexts. ReportMemoryEvents records them
	// in a memory report.
	OnMemoryEvent func(MemoryEvent)
}

// Model is a llama.cpp model whose weights live in pmm Buffers charged to
// the holder Name+"/weights" (or, with Options.Stock, in llama.cpp's own
// buffers).
type Model struct {
	opts    Options
	path    string
	nVocab  int
	info    *gguf.Info
	c       *C.struct_llama_model
	weights *pmm.Binding
	holder  governor.HolderID

	// During the load (under loadMu).
	loadCtx  context.Context
	allocErr error

	virtual bool // the weights are Regions (the device offers VirtualBacking)

	mu       sync.Mutex
	closed   bool
	bufs     []*weightBuffer
	released []owned // closed, maybe not yet refunded
	contexts map[*Context]struct{}
	nextID   int

	sleepTurn chan struct{}   // serializes Sleep, Wake and Close, taken bounded by their ctx
	asleep    bool            // under mu: the weights are offloaded or discarded
	level     int             // under mu: the sleep's level (1 or 2) while asleep
	sleeping  []hostCopier    // under mu: the weights' host copies while asleep
	discarded []*weightBuffer // under mu: the weight regions a level-2 sleep decommitted, to reload

	// The model file as loaded (reload.go): its absolute path and identity.
	file    string
	stamp   fileStamp
	stamped bool
	// The time the reloads of level-2 wakes took, summed: committing the
	// regions, and reading the file into them (in the sleep turn).
	wakeCommit, wakeRead time.Duration
	// onPressure answers a ticket to the weights' holder
	// (Options.SleepOnPressure), once a Server set it; under mu.
	onPressure func(ctx context.Context, t governor.Ticket) (memapi.Bytes, error)

	// The time the weights' direct moves took, summed (hostcopy.go): the
	// copies into the host tier, and the commits and copies back.
	moveCopy, wakeCommit1, wakeCopy1 time.Duration
}

// LoadModel checks the GGUF file at path (gguf.Check: a missing,
// truncated or corrupt file is a *gguf.FormatError) and loads it with
// llama.cpp, every layer (and the token embeddings) on memgen's device.
// ctx bounds the weights' reservations. On failure nothing stays charged.
func LoadModel(ctx context.Context, path string, opts Options) (*Model, error) {
	const op = "llamacpp.LoadModel"
	if !loaded() {
		return nil, ErrNotLoaded
	}
	if opts.Name == "" {
		opts.Name = "llama"
	}
	if opts.Threads <= 0 {
		opts.Threads = 1
	}
	info, err := gguf.Check(path)
	if err != nil {
		return nil, err
	}
	emb, ok := info.Tensor("token_embd.weight")
	if !ok || len(emb.Dims) != 2 || emb.Dims[1] == 0 {
		return nil, &gguf.FormatError{Path: path, Kind: gguf.ErrCorrupt, Detail: "no token_embd.weight of 2 dimensions"}
	}
	m := &Model{opts: opts, path: path, info: info, nVocab: int(emb.Dims[1]), contexts: map[*Context]struct{}{}, sleepTurn: make(chan struct{}, 1)}
	m.stampFile()
	if !opts.Stock {
		if opts.Manager == nil || opts.Governor == nil {
			return nil, memapi.Errorf(op, memapi.ErrNilHandle, "Options.Manager and Options.Governor are required (or Stock)")
		}
		m.holder = governor.HolderID(opts.Name + "/weights")
		var reclaimer governor.Holder // nil: never asked
		if opts.SleepOnPressure {
			reclaimer = governor.HolderFunc(m.reclaimWeights)
		}
		if err := opts.Governor.Register(m.holder, reclaimer, governor.HolderOptions{}); err != nil {
			return nil, err
		}
		m.weights, err = opts.Manager.Bind(string(m.holder), "weights", opts.Device)
		if err != nil {
			return nil, errors.Join(err, opts.Governor.Unregister(m.holder))
		}
		caps, err := m.weights.Capabilities()
		if err != nil {
			return nil, errors.Join(err, m.weights.Close(), opts.Governor.Unregister(m.holder))
		}
		m.virtual = caps.Has(memapi.CapVirtualBacking)
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	ours := C.int(1)
	if opts.Stock {
		ours = 0
	}
	loadMu.Lock()
	m.loadCtx = ctx
	h := cgo.NewHandle(allocator(m))
	lastError()
	m.c = C.memgen_llama_model_load(cpath, ours, C.uintptr_t(h))
	h.Delete()
	msg, allocErr := lastError(), m.allocErr
	m.loadCtx, m.allocErr = nil, nil
	loadMu.Unlock()
	if m.c == nil {
		err := fmt.Errorf("%w: %s: %s", ErrModel, path, msg)
		if allocErr != nil {
			err = fmt.Errorf("%w: %s: %w", ErrModel, path, allocErr)
		}
		return nil, errors.Join(err, m.release(ctx))
	}
	return m, nil
}

// reclaimWeights is the weights' holder's Reclaim (Options.SleepOnPressure):
// what onPressure answers, or 0 while nothing set it.
func (m *Model) reclaimWeights(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	m.mu.Lock()
	f := m.onPressure
	m.mu.Unlock()
	if f == nil {
		return 0, nil
	}
	return f(ctx, t)
}

// setOnPressure sets (or with nil clears) the answer to the weights'
// tickets; it fails when another is set.
func (m *Model) setOnPressure(f func(context.Context, governor.Ticket) (memapi.Bytes, error)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if f != nil && m.onPressure != nil {
		return memapi.Errorf("llamacpp.Model", memapi.ErrInUse, "another server answers the weights' tickets")
	}
	m.onPressure = f
	return nil
}

// NVocab is the model's vocabulary size: tokens are 0 ... NVocab-1.
func (m *Model) NVocab() int { return m.nVocab }

// Holder is the weights' holder ("" with Options.Stock).
func (m *Model) Holder() governor.HolderID { return m.holder }

// WeightBytes is what the weights' buffers hold (0 with Options.Stock).
func (m *Model) WeightBytes() memapi.Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n memapi.Bytes
	for _, b := range m.bufs {
		n += b.size
	}
	return n
}

// allocBuffer allocates a buffer of weights (of either buffer type: with
// the host one llama.cpp may place the input layer there): a Region
// committed whole where the device offers VirtualBacking, else a Buffer.
func (m *Model) allocBuffer(size memapi.Bytes, _ bool) (buffer, error) {
	size = max(size, 1)
	w := &weightBuffer{m: m}
	var err error
	if m.virtual {
		if w.reg, err = m.weights.ReserveVirtual(m.loadCtx, size); err == nil {
			if err = w.reg.Grow(m.loadCtx, size, nil); err != nil {
				_ = w.reg.Close()
				m.mu.Lock()
				m.released = append(m.released, w.reg)
				m.mu.Unlock()
			}
			w.size = w.reg.Len()
		}
	} else if w.buf, err = m.weights.Allocate(m.loadCtx, size); err == nil {
		w.size = w.buf.Size()
	}
	if err != nil {
		m.allocErr = err
		return nil, err
	}
	m.mu.Lock()
	m.bufs = append(m.bufs, w)
	m.mu.Unlock()
	return w, nil
}

func (m *Model) freeWeights(w *weightBuffer) {
	var h interface {
		owned
		Close() error
	} = w.buf
	if w.reg != nil {
		h = w.reg
	}
	m.mu.Lock()
	m.bufs = slices.DeleteFunc(m.bufs, func(x *weightBuffer) bool { return x == w })
	m.released = append(m.released, h)
	m.mu.Unlock()
	// No fence: the weights are freed by llama_model_free, after every
	// context (and so every decode) of the model ended.
	_ = h.Close() // a failed free is quarantined by pmm and waited for in release
}

// Close frees the model: its weights are released and refunded, the
// weights' holder is unregistered. Every context must be closed first
// (memapi.ErrInUse otherwise); a second Close fails with memapi.ErrClosed.
// ctx bounds the wait for a Sleep or Wake in progress and for the refunds.
// An asleep model closes too: its host copies are dropped.
func (m *Model) Close(ctx context.Context) error {
	const op = "llamacpp.Model.Close"
	if err := takeTurn(ctx, op, m.sleepTurn); err != nil {
		return err
	}
	defer func() { <-m.sleepTurn }()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrClosed, "model %s was closed", m.path)
	}
	if n := len(m.contexts); n > 0 {
		m.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrInUse, "model %s has %d open contexts", m.path, n)
	}
	m.closed = true
	drop := dropSleeping(m.sleeping) // asleep: the weights' host copies go with it
	m.sleeping, m.discarded, m.asleep, m.level = nil, nil, false, 0
	m.mu.Unlock()
	C.memgen_llama_model_free(m.c)
	m.c = nil
	return errors.Join(drop, m.release(ctx))
}

// release waits until the weights' buffers were refunded, then ends the
// holder and its binding.
func (m *Model) release(ctx context.Context) error {
	if m.weights == nil {
		return nil
	}
	m.mu.Lock()
	rel := m.released
	m.released = nil
	m.mu.Unlock()
	if err := waitReleased(ctx, rel...); err != nil {
		return err
	}
	return errors.Join(m.weights.Close(), m.opts.Governor.Unregister(m.holder))
}

// owned is a pmm handle whose release can be waited for.
type owned interface {
	State() ep.State
	Err() error
}

// waitReleased waits, bounded by ctx, until every handle was freed and
// refunded (closed handles are released on their device context's queue,
// behind their fences).
func waitReleased[T owned](ctx context.Context, hs ...T) error {
	delay := 50 * time.Microsecond
	for _, h := range hs {
		for h.State() != ep.Released {
			if h.State() == ep.Quarantined {
				return fmt.Errorf("llamacpp: a release failed (quarantined, still charged): %w", h.Err())
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("llamacpp: waiting for releases: %w", ctx.Err())
			case <-time.After(delay):
			}
			delay = min(2*delay, 5*time.Millisecond)
		}
	}
	return nil
}

// kvRowBytes is the bytes one cell takes in a context's KV cache, from
// the GGUF metadata: K and V of every layer, F16 (llama.cpp's default
// cache type, which the bridge keeps), head_count_kv heads of key_length
// and value_length (n_embd / head_count when absent). 0 when the metadata
// does not say (llama.cpp then refuses the model, or the check after the
// allocation measures it).
func (m *Model) kvRowBytes() memapi.Bytes {
	arch := m.info.String("general.architecture")
	layers, ok1 := m.info.Uint(arch + ".block_count")
	embd, ok2 := m.info.Uint(arch + ".embedding_length")
	heads, ok3 := m.info.Uint(arch + ".attention.head_count")
	if !ok1 || !ok2 || !ok3 || heads == 0 {
		return 0
	}
	headsKV, ok := m.info.Uint(arch + ".attention.head_count_kv")
	if !ok {
		headsKV = heads
	}
	k, ok := m.info.Uint(arch + ".attention.key_length")
	if !ok {
		k = embd / heads
	}
	v, ok := m.info.Uint(arch + ".attention.value_length")
	if !ok {
		v = embd / heads
	}
	return memapi.Bytes(layers * headsKV * (k + v) * 2)
}

// checkContext refuses, before anything is allocated, a context of nCtx
// cells that the model cannot hold: beyond its trained context (a
// *LimitError; RoPE scaling, which would allow more, is not offered), or
// one whose KV cache at nCtx cells and the weights together exceed the
// authority's capacity (an *OverBudgetError: one sequence at its longest
// must fit beside the weights; the cells are committed only as they are
// used).
func (m *Model) checkContext(nCtx int) error {
	arch := m.info.String("general.architecture")
	if train, ok := m.info.Uint(arch + ".context_length"); ok && train > 0 && uint64(nCtx) > train {
		return &LimitError{Field: "n_ctx", Value: nCtx, Limit: int(min(train, 1<<31-1)),
			Reason: "the model's trained context (" + arch + ".context_length); RoPE scaling beyond it is not offered"}
	}
	row := m.kvRowBytes()
	if m.opts.Stock || row == 0 {
		return nil
	}
	a, _ := m.weights.Authority()
	s, _ := m.opts.Governor.Authority(a)
	weights, capacity := m.WeightBytes(), m.limit(s.Capacity)
	if kv := memapi.Bytes(nCtx) * row; kv/row != memapi.Bytes(nCtx) || weights+kv > capacity {
		return &OverBudgetError{Context: m.opts.Name + "/ctx", Rows: nCtx, Wanted: memapi.Bytes(nCtx) * row, Weights: weights, Capacity: capacity, Free: s.Free}
	}
	return nil
}

// limit is the most the authority of the given capacity can grow to:
// Options.Limit's answer when larger.
func (m *Model) limit(capacity memapi.Bytes) memapi.Bytes {
	if m.opts.Limit != nil {
		return max(capacity, m.opts.Limit())
	}
	return capacity
}
