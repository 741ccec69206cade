package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
)

// holderPool is the activation workspace's holder: a caching pool.
const holderPool = "activations"

// poolPriority orders the workspace among caches only: it is a cache
// (governor.HolderOptions.Cache), asked before every other holder whatever
// the priorities. Without Cache it would come after the second model and
// the KV store, with the served model whose forward pass needs it.
const poolPriority = 20

// workspace is a serving engine's activation workspace: each decode step
// allocates its activations from a pool.Pool over its own binding on the
// device and frees them at the step's end, behind the step's fence. The
// pool's cache grows to the largest step and then sits cached, charged to
// the holder; under pressure the governor asks it first.
type workspace struct {
	shape memapi.Bytes // hidden size in bytes per request: kv heads x head dim x dtype
	vocab memapi.Bytes
	layer int
	bind  *pmm.Binding
	pool  *pool.Pool
	live  []pool.Block // the step's activations, until its end
	stamp []byte       // written at the head of every activation through the stream

	allocs, steps uint64
	largest       memapi.Bytes // the largest step's activations, rounded as the pool holds them
	// latency is the wall time of every pool.Alloc (the slow ones include
	// the reservations that waited for pressure to free room).
	latency []time.Duration
}

// newWorkspace binds the activations holder on the device and builds its
// pool: a region as large as the budget (it can never hold more), grown in
// the mechanism's granules, slabs of at least 64 KiB.
func newWorkspace(s *stack, gran memapi.Bytes) (*workspace, error) {
	b, err := s.mgr.Bind(holderPool, holderPool, s.devKey, pmm.WithPriority(poolPriority))
	if err != nil {
		return nil, err
	}
	p, err := pool.New(b, pool.Options{SegmentBytes: gran, SlabBytes: 64 << 10, RegionBytes: roundUpTo(s.cfg.Budget, gran), Wait: waitLimit})
	if err != nil {
		return nil, errors.Join(err, b.Close())
	}
	sh := s.cfg.Shape
	return &workspace{shape: memapi.Bytes(sh.KVHeads * sh.HeadDim * sh.DTypeBytes), vocab: memapi.Bytes(s.cfg.Vocab),
		layer: sh.Layers, bind: b, pool: p, stamp: pattern("activations", tokenStamp)}, nil
}

func roundUpTo(n, g memapi.Bytes) memapi.Bytes { return (n + g - 1) / g * g }

// register makes the pool a governor holder: a cache, asked first.
func (w *workspace) register(g *governor.Governor) error {
	return g.Register(holderPool, w.pool, governor.HolderOptions{Priority: poolPriority, Cache: true})
}

// sizes returns the activations of a decode step of batch requests: per
// layer the residual stream (batch x hidden), the fused query/key/value
// projection (3 x hidden; the scaled model has as many query heads as KV
// heads), the attention output (hidden) and the MLP's up-projection
// (4 x hidden), all in the model's dtype, and once the logits over the
// vocabulary in fp32 for sampling. Small ones come from the pool's size
// classes, the larger ones (the MLP's and the logits at the default
// shape; the logits at any batch of a few requests) from its arena.
func (w *workspace) sizes(batch int) []memapi.Bytes {
	b := memapi.Bytes(batch)
	out := make([]memapi.Bytes, 0, 4*w.layer+1)
	for range w.layer {
		out = append(out, b*w.shape, 3*b*w.shape, b*w.shape, 4*b*w.shape)
	}
	if w.vocab > 0 {
		out = append(out, b*w.vocab*4)
	}
	return out
}

// alloc allocates a step's activations for batch requests on stream st
// and writes a stamp at the head of each through it. A failure frees what
// the step took.
func (w *workspace) alloc(ctx context.Context, batch int, st memapi.Stream) error {
	if len(w.live) != 0 {
		return fmt.Errorf("activations: %d blocks of the last step still live", len(w.live))
	}
	if batch == 0 {
		return nil
	}
	w.steps++
	var held memapi.Bytes
	for _, n := range w.sizes(batch) {
		start := time.Now()
		blk, err := w.pool.Alloc(ctx, n, st)
		w.latency = append(w.latency, time.Since(start))
		if err != nil {
			return errors.Join(fmt.Errorf("activations of a step of %d requests: %w", batch, err), w.drop(ctx, st))
		}
		w.live = append(w.live, blk)
		w.allocs++
		held += blk.Rounded()
		if err := st.CopyToDevice(blk.Addr(), w.stamp[:min(len(w.stamp), int(n))]); err != nil {
			return errors.Join(fmt.Errorf("activations: writing a %s block: %w", fmtBytes(n), err), w.drop(ctx, st))
		}
	}
	w.largest = max(w.largest, held)
	return nil
}

// release ends the step: every activation records the step's fence f (nil:
// none was recorded) and goes back to the pool, reusable at once on the
// step's stream and by Reclaim once f completes.
func (w *workspace) release(f memapi.Fence) error {
	var errs []error
	for _, blk := range w.live {
		if f != nil {
			errs = append(errs, blk.RecordUse(f))
		}
		errs = append(errs, blk.Free())
	}
	w.live = w.live[:0]
	return errors.Join(errs...)
}

// drop frees the step's activations after a failure, behind a fence of
// the stamps already enqueued on st (or once st is synchronized, if no
// fence can be recorded).
func (w *workspace) drop(ctx context.Context, st memapi.Stream) error {
	if len(w.live) == 0 {
		return nil
	}
	f, err := st.Record()
	if err != nil {
		if serr := st.Synchronize(ctx); serr != nil {
			return errors.Join(err, serr) // the blocks stay in use: Close then fails, visibly
		}
		f = nil // the stamps are done
	}
	return w.release(f)
}

// close releases the pool and then its binding. The run ends every step it
// began, so no block is in use; one that is makes Close fail (ErrInUse)
// and the binding stay open, both reported.
func (w *workspace) close() error {
	return errors.Join(w.pool.Close(), w.bind.Close())
}

// latencies summarises the wall time of the pool's Allocs.
type latencies struct {
	N                   int
	P50, P99, P999, Max time.Duration
}

func summarise(ds []time.Duration) latencies {
	if len(ds) == 0 {
		return latencies{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return latencies{N: len(s), P50: at(0.50), P99: at(0.99), P999: at(0.999), Max: s[len(s)-1]}
}
