package llamacpp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// ErrAsleep is what a call that would touch an asleep model's weights or
// an asleep context's KV cache fails with (Decode, DecodeBatch, Reset,
// ResetSeq, NewContext): Wake first.
var ErrAsleep = errors.New("llamacpp: asleep (Wake first)")

// Sleep puts the model and every context of it to sleep: the committed
// bytes of the weights and of each context's KV cache move to host, a
// binding of the same manager on another authority (the host tier), and
// their device backing is decommitted, every reservation kept (each move
// is a pmm.Region.Offload: the host tier is charged before the copy, the
// device released only after it). llama.cpp's tensors keep their
// addresses; Wake puts the bytes back behind them and the engine goes on
// where it was, its sequences and cells untouched. Asleep, the device
// holds none of the model's weights or KV bytes.
//
// Sleep waits, bounded by ctx, for the calls in progress on the contexts
// (a decode finishes first), and holds them off until it is done; while
// asleep the calls that would touch the moved bytes fail with ErrAsleep
// and a context's Reclaim gives nothing (it has nothing on the device).
// Closing an asleep context or model drops its host copies.
//
// It is one transaction: should a move fail, the moves made are undone
// (their bytes restored) and the error returned, the engine awake; should
// an undo fail too, what it could not restore stays asleep (Wake retries
// it) and both errors are returned. A model whose weights are not in
// regions (a device without VirtualBacking, or Options.Stock) refuses with
// memapi.ErrUnsupported. Sleeping an asleep model does nothing.
func (m *Model) Sleep(ctx context.Context, host *pmm.Binding) error {
	const op = "llamacpp.Model.Sleep"
	if !m.virtual {
		return memapi.Errorf(op, memapi.ErrUnsupported, "the weights are not in regions (the device offers no VirtualBacking, or the model is stock)")
	}
	if host == nil {
		return memapi.Errorf(op, memapi.ErrNilHandle, "no host binding")
	}
	if err := takeTurn(ctx, op, m.sleepTurn); err != nil {
		return err
	}
	defer func() { <-m.sleepTurn }()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrClosed, "model %s was closed", m.path)
	}
	if m.asleep {
		m.mu.Unlock()
		return nil
	}
	cs := make([]*Context, 0, len(m.contexts))
	for c := range m.contexts {
		cs = append(cs, c)
	}
	weights := make([]*pmm.Region, 0, len(m.bufs))
	for _, w := range m.bufs {
		weights = append(weights, w.reg)
	}
	m.mu.Unlock()
	slices.SortFunc(cs, func(a, b *Context) int { return cmp.Compare(a.holder, b.holder) })

	var held []*Context // locked, in order
	defer func() {
		for _, c := range held {
			c.mu.Unlock()
		}
	}()
	for _, c := range cs {
		if err := lockBounded(ctx, &c.mu); err != nil {
			return fmt.Errorf("%s: waiting for context %s's call in progress: %w", op, c.holder, err)
		}
		held = append(held, c)
	}

	// undo restores what moved, last first; what it cannot restore stays
	// asleep.
	var moved []hostCopy
	undo := func(err error) error {
		uctx := context.WithoutCancel(ctx)
		var left []hostCopy
		for i := len(moved) - 1; i >= 0; i-- {
			if rerr := moved[i].o.Restore(uctx); rerr != nil {
				err = errors.Join(err, rerr)
				left = append(left, moved[i])
			}
		}
		if len(left) != 0 {
			// The whole engine stays asleep, so nothing reads a range
			// that could not come back; Wake retries every host copy
			// still held.
			m.setAsleep(held, left)
		}
		return err
	}
	for _, c := range held {
		if c.closed {
			continue
		}
		for _, t := range c.tensors {
			o, err := t.region.Offload(ctx, host)
			if o != nil {
				moved = append(moved, hostCopy{c, o})
			}
			if err != nil {
				return undo(fmt.Errorf("%s: the KV cache of %s: %w", op, c.holder, err))
			}
		}
	}
	for _, r := range weights {
		o, err := r.Offload(ctx, host)
		if o != nil {
			moved = append(moved, hostCopy{nil, o})
		}
		if err != nil {
			return undo(fmt.Errorf("%s: the weights: %w", op, err))
		}
	}
	m.setAsleep(held, moved)
	return nil
}

// hostCopy is one region's bytes in the host tier: of context c's KV
// cache, or of the weights (c nil).
type hostCopy struct {
	c *Context
	o *pmm.Offloaded
}

// setAsleep marks the model and the contexts in cs (whose locks are held)
// asleep, each holding its host copies.
func (m *Model) setAsleep(cs []*Context, copies []hostCopy) {
	for _, c := range cs {
		c.asleep = !c.closed
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asleep = true
	for _, hc := range copies {
		if hc.c == nil {
			m.sleeping = append(m.sleeping, hc.o)
		} else {
			hc.c.sleeping = append(hc.c.sleeping, hc.o)
		}
	}
}

// Wake brings an asleep model back: the weights' bytes, then each
// context's KV cache, are committed again at their addresses and copied
// back from the host tier (pmm.Offloaded.Restore: the device charged
// first, with pressure, bounded by ctx), and the host copies freed. A
// context is awake once all its bytes are back; should a restore fail, the
// error is returned and what was not restored stays asleep, its bytes safe
// in the host tier: Wake again retries it. Waking an awake model does
// nothing.
func (m *Model) Wake(ctx context.Context) error {
	const op = "llamacpp.Model.Wake"
	if err := takeTurn(ctx, op, m.sleepTurn); err != nil {
		return err
	}
	defer func() { <-m.sleepTurn }()
	m.mu.Lock()
	if !m.asleep {
		m.mu.Unlock()
		return nil
	}
	cs := make([]*Context, 0, len(m.contexts))
	for c := range m.contexts {
		cs = append(cs, c)
	}
	m.mu.Unlock()
	slices.SortFunc(cs, func(a, b *Context) int { return cmp.Compare(a.holder, b.holder) })

	if err := m.restoreWeights(ctx); err != nil {
		return fmt.Errorf("%s: the weights: %w", op, err)
	}
	for _, c := range cs {
		if err := lockBounded(ctx, &c.mu); err != nil {
			return fmt.Errorf("%s: context %s: %w", op, c.holder, err)
		}
		err := c.wakeLocked(ctx)
		c.mu.Unlock()
		if err != nil {
			return fmt.Errorf("%s: the KV cache of %s: %w", op, c.holder, err)
		}
	}
	m.mu.Lock()
	m.asleep = false
	m.mu.Unlock()
	return nil
}

// restoreWeights restores the weights' host copies, each once.
func (m *Model) restoreWeights(ctx context.Context) error {
	m.mu.Lock()
	offs := m.sleeping
	m.mu.Unlock()
	for len(offs) > 0 {
		if err := offs[0].Restore(ctx); err != nil {
			return err
		}
		offs = offs[1:]
		m.mu.Lock()
		m.sleeping = offs
		m.mu.Unlock()
	}
	return nil
}

// wakeLocked restores the context's KV host copies (c.mu held).
func (c *Context) wakeLocked(ctx context.Context) error {
	for len(c.sleeping) > 0 {
		if err := c.sleeping[0].Restore(ctx); err != nil {
			return err
		}
		c.sleeping = c.sleeping[1:]
	}
	c.asleep = false
	return nil
}

// Asleep reports whether the model is asleep (Sleep, not yet Wake).
func (m *Model) Asleep() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.asleep
}

// dropSleeping discards host copies of a context or model being closed:
// their ranges are freed with it.
func dropSleeping(offs []*pmm.Offloaded) error {
	var errs []error
	for _, o := range offs {
		if err := o.Discard(); err != nil && !errors.Is(err, memapi.ErrReleased) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// takeTurn takes turn (a one-slot channel), bounded by ctx.
func takeTurn(ctx context.Context, op string, turn chan struct{}) error {
	select {
	case turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "another Sleep or Wake is in progress", Err: context.Cause(ctx)}
	}
}

// lockBounded takes mu, waiting at most until ctx ends (a call in
// progress holds it for the length of one decode).
func lockBounded(ctx context.Context, mu *sync.Mutex) error {
	delay := 50 * time.Microsecond
	for !mu.TryLock() {
		select {
		case <-ctx.Done():
			return &memapi.Error{Kind: memapi.ErrInUse, Detail: "a call in progress", Err: context.Cause(ctx)}
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
	return nil
}
