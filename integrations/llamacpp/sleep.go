package llamacpp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
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

// ErrNotAsleep is what Wake of a model that is not asleep fails with.
var ErrNotAsleep = errors.New("llamacpp: not asleep (Sleep first)")

// ErrSleepLevel is what SleepLevel fails with for a level other than 1
// or 2.
var ErrSleepLevel = errors.New("llamacpp: sleep level out of range (1 or 2)")

// Sleep puts the model to sleep at level 1: SleepLevel(ctx, 1, host).
func (m *Model) Sleep(ctx context.Context, host *pmm.Binding) error {
	_, err := m.sleep(ctx, "llamacpp.Model.Sleep", 1, host)
	return err
}

// SleepLevel puts the model and every context of it to sleep, giving the
// device back the memory of the weights and of the KV caches while
// llama.cpp's tensors keep their addresses (every reservation is kept);
// Wake puts the bytes back behind them.
//
// Level 1 moves: the committed bytes of the weights and of each context's
// KV cache move to host, a binding of the same manager on another
// authority (the host tier), and their device backing is decommitted (each
// move is one transaction, pmm.Region.Offload's: the host tier is charged
// before the copy, the device released only after it; a weight region's
// bytes are copied straight into the host copy when it is a CPU
// mechanism's, see hostcopy.go). Wake copies them back, and the engine
// goes on where it was, its sequences and cells untouched.
//
// Level 2 discards: the weights' regions are decommitted with nothing
// copied anywhere (nothing is charged on the host tier for them), and Wake
// commits the same ranges again and reads each tensor's bytes from the
// model file at its offset straight into its place. It also discards the
// cells of every finished sequence (Context.FinishSeq; their tokens are
// kept, and the next call that names one recomputes them). A running
// sequence (one that holds cells and was not finished) is not waited for:
// its KV cache moves to host as at level 1 and comes back intact, so it
// decodes on as if uninterrupted; host may be nil when nothing has to
// move. The first level-2 sleep compares every weight tensor with the
// file; a region holding one whose bytes are not the file's (llama.cpp
// converted it at load) moves to host as at level 1 (SleepState names the
// tensor). A model file whose size, modification time or identity changed
// since LoadModel, or that cannot be opened, refuses the sleep with a
// *ModelFileError, nothing changed.
//
// SleepLevel waits, bounded by ctx, for the calls in progress on the
// contexts (a decode finishes first), and holds them off until it is done;
// while asleep the calls that would touch the moved or discarded bytes
// fail with ErrAsleep and a context's Reclaim gives nothing. Closing an
// asleep context or model drops its host copies.
//
// It is one transaction: should a step fail, the steps made are undone
// (moved bytes restored, discarded regions reloaded) and the error
// returned, the engine awake (finished sequences' cells stay discarded:
// they are recomputed when needed); should an undo fail too, what it could
// not restore stays asleep (Wake retries it) and both errors are returned.
// A level other than 1 or 2 is ErrSleepLevel; a model already asleep
// ErrAsleep; a model whose weights are not in regions (a device without
// VirtualBacking, or Options.Stock) memapi.ErrUnsupported; a closed one
// memapi.ErrClosed.
func (m *Model) SleepLevel(ctx context.Context, level int, host *pmm.Binding) error {
	_, err := m.sleep(ctx, "llamacpp.Model.SleepLevel", level, host)
	return err
}

// sleep is SleepLevel: it returns the device bytes the sleep gave back
// (the weights' and the KV caches'), and tells Options.OnMemoryEvent of
// a sleep that began.
func (m *Model) sleep(ctx context.Context, op string, level int, host *pmm.Binding) (memapi.Bytes, error) {
	if level != 1 && level != 2 {
		return 0, fmt.Errorf("%s: level %d: %w", op, level, ErrSleepLevel)
	}
	if !m.virtual {
		return 0, memapi.Errorf(op, memapi.ErrUnsupported, "the weights are not in regions (the device offers no VirtualBacking, or the model is stock)")
	}
	if host == nil && level == 1 {
		return 0, memapi.Errorf(op, memapi.ErrNilHandle, "no host binding")
	}
	start := time.Now()
	if err := takeTurn(ctx, op, m.sleepTurn); err != nil {
		return 0, err
	}
	defer func() { <-m.sleepTurn }()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return 0, memapi.Errorf(op, memapi.ErrClosed, "model %s was closed", m.path)
	}
	if m.asleep {
		lv := m.level
		m.mu.Unlock()
		return 0, fmt.Errorf("%s: already asleep at level %d: %w", op, lv, ErrAsleep)
	}
	cs := make([]*Context, 0, len(m.contexts))
	for c := range m.contexts {
		cs = append(cs, c)
	}
	weights := slices.Clone(m.bufs)
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
			return 0, fmt.Errorf("%s: waiting for context %s's call in progress: %w", op, c.holder, err)
		}
		held = append(held, c)
	}
	t := &sleeper{m: m, op: op, ctx: ctx, level: level, host: host, held: held}
	before := committed(weights, held)
	var err error
	if level == 1 {
		err = t.moveAll(weights)
	} else {
		err = t.discard(weights)
	}
	var freed memapi.Bytes
	if after := committed(weights, held); after < before {
		freed = before - after
	}
	m.emitMove("sleep", level, freed, start, err)
	return freed, err
}

// committed is what the weights' regions and the KV caches of the
// contexts in cs (their locks held) hold on the device.
func committed(weights []*weightBuffer, cs []*Context) memapi.Bytes {
	var n memapi.Bytes
	for _, w := range weights {
		n += w.reg.Committed()
	}
	for _, c := range cs {
		for _, kt := range c.tensors {
			n += kt.region.Committed()
		}
	}
	return n
}

// sleeper is one Sleep in progress: what it moved and discarded so far,
// which its undo puts back.
type sleeper struct {
	m     *Model
	op    string
	ctx   context.Context
	level int
	host  *pmm.Binding
	held  []*Context // locked
	file  *os.File   // level 2: the model file

	moved     []hostCopy
	discarded []*weightBuffer
}

// moveAll is level 1: every region's committed bytes move to the host.
func (t *sleeper) moveAll(weights []*weightBuffer) error {
	for _, c := range t.held {
		if c.closed {
			continue
		}
		for _, kt := range c.tensors {
			if err := t.move(c, kt.region); err != nil {
				return t.undo(fmt.Errorf("%s: the KV cache of %s: %w", t.op, c.holder, err))
			}
		}
	}
	for _, w := range weights {
		if err := t.moveWeights(w); err != nil {
			return t.undo(fmt.Errorf("%s: the weights: %w", t.op, err))
		}
	}
	t.m.setAsleep(t.held, t.level, t.moved, nil)
	return nil
}

// move offloads a region of context c's KV cache (its committed bytes) to
// the host tier.
func (t *sleeper) move(c *Context, r *pmm.Region) error {
	o, err := r.Offload(t.ctx, t.host)
	if o != nil {
		t.moved = append(t.moved, hostCopy{c, o})
	}
	return err
}

// moveWeights moves a weight region's bytes to the host tier
// (Model.moveWeights).
func (t *sleeper) moveWeights(w *weightBuffer) error {
	o, err := t.m.moveWeights(t.ctx, w, t.host)
	if o != nil {
		t.moved = append(t.moved, hostCopy{nil, o})
	}
	return err
}

// discard is level 2: the finished sequences' KV is dropped, the running
// ones' and the weights that are not the file's move, and the other
// weights are decommitted.
func (t *sleeper) discard(weights []*weightBuffer) error {
	f, err := t.m.openFile(t.op)
	if err != nil {
		return err
	}
	t.file = f
	defer f.Close()
	for _, w := range weights {
		if err := w.check(t.ctx, t.op, f); err != nil {
			return err
		}
	}
	if t.host == nil {
		for _, w := range weights {
			if w.differs != "" {
				return memapi.Errorf(t.op, memapi.ErrNilHandle, "no host binding, and tensor %s must move", w.differs)
			}
		}
		for _, c := range t.held {
			if !c.closed && c.running() {
				return memapi.Errorf(t.op, memapi.ErrNilHandle, "no host binding, and context %s has a running sequence, whose KV cache must move", c.holder)
			}
		}
	}
	for _, c := range t.held {
		if err := c.dropFinished(t.ctx); err != nil {
			return fmt.Errorf("%s: the finished sequences of %s: %w", t.op, c.holder, err)
		}
	}
	for _, c := range t.held {
		if c.closed {
			continue
		}
		for _, kt := range c.tensors {
			if kt.region.Committed() == 0 {
				continue
			}
			if err := t.move(c, kt.region); err != nil {
				return t.undo(fmt.Errorf("%s: the KV cache of %s: %w", t.op, c.holder, err))
			}
		}
	}
	for _, w := range weights {
		if w.differs == "" {
			continue
		}
		if err := t.moveWeights(w); err != nil {
			return t.undo(fmt.Errorf("%s: the weights: %w", t.op, err))
		}
	}
	for _, w := range weights {
		if w.differs != "" {
			continue
		}
		if err := w.discard(t.ctx); err != nil {
			return t.undo(fmt.Errorf("%s: the weights' %s: %w", t.op, w.name(), err))
		}
		t.discarded = append(t.discarded, w)
	}
	t.m.setAsleep(t.held, t.level, t.moved, t.discarded)
	return nil
}

// undo puts back what the sleep moved and discarded, last first; what it
// cannot restore stays asleep.
func (t *sleeper) undo(err error) error {
	uctx := context.WithoutCancel(t.ctx)
	var left []*weightBuffer
	for i := len(t.discarded) - 1; i >= 0; i-- {
		if rerr := t.m.reload(uctx, t.op, t.file, t.discarded[i]); rerr != nil {
			err = errors.Join(err, rerr)
			left = append(left, t.discarded[i])
		}
	}
	var kept []hostCopy
	for i := len(t.moved) - 1; i >= 0; i-- {
		if rerr := t.moved[i].o.Restore(uctx); rerr != nil {
			err = errors.Join(err, rerr)
			kept = append(kept, t.moved[i])
		}
	}
	if len(left) != 0 || len(kept) != 0 {
		// The whole engine stays asleep, so nothing reads a range that
		// could not come back; Wake retries every host copy still held
		// and reloads every region still discarded.
		t.m.setAsleep(t.held, t.level, kept, left)
	}
	return err
}

// hostCopy is one region's bytes in the host tier: of context c's KV
// cache, or of the weights (c nil).
type hostCopy struct {
	c *Context
	o hostCopier
}

// setAsleep marks the model and the contexts in cs (whose locks are held)
// asleep at level, each holding its host copies, the model its discarded
// regions.
func (m *Model) setAsleep(cs []*Context, level int, copies []hostCopy, discarded []*weightBuffer) {
	for _, c := range cs {
		c.asleep = !c.closed
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asleep, m.level = true, level
	m.discarded = append(m.discarded, discarded...)
	for _, hc := range copies {
		if hc.c == nil {
			m.sleeping = append(m.sleeping, hc.o)
		} else {
			hc.c.sleeping = append(hc.c.sleeping, hc.o)
		}
	}
}

// Wake brings an asleep model back. First the regions a level-2 sleep
// discarded: the model file is checked (a *ModelFileError when it changed
// or cannot be opened, nothing done), then each region is committed again
// at its address (the device charged first, with pressure, bounded by
// ctx) and its tensors read from the file into it; should one commit or
// read fail, every region this Wake reloaded is decommitted again and the
// error returned: the weights are as asleep as before. Then the host
// copies: the weights', then each context's KV cache, committed again at
// their addresses and copied back (pmm.Offloaded.Restore, or for a weight
// region copied straight, its commit in chunks that run ahead of the
// copy), the host copies freed. A context is awake once all its bytes are back; should a restore
// fail, the error is returned and what was not restored stays asleep, its
// bytes safe in the host tier. Either way the model stays asleep and Wake
// again retries what is left. Waking a model that is not asleep is
// ErrNotAsleep.
func (m *Model) Wake(ctx context.Context) error {
	const op = "llamacpp.Model.Wake"
	start := time.Now()
	if err := takeTurn(ctx, op, m.sleepTurn); err != nil {
		return err
	}
	defer func() { <-m.sleepTurn }()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return memapi.Errorf(op, memapi.ErrClosed, "model %s was closed", m.path)
	}
	if !m.asleep {
		m.mu.Unlock()
		return fmt.Errorf("%s: %w", op, ErrNotAsleep)
	}
	cs := make([]*Context, 0, len(m.contexts))
	for c := range m.contexts {
		cs = append(cs, c)
	}
	level, weights := m.level, slices.Clone(m.bufs)
	m.mu.Unlock()
	slices.SortFunc(cs, func(a, b *Context) int { return cmp.Compare(a.holder, b.holder) })

	// taken is the device bytes the wake committed again so far, which
	// Options.OnMemoryEvent is told of.
	var taken memapi.Bytes
	grew := func(before, after memapi.Bytes) {
		if after > before {
			taken += after - before
		}
	}
	before := committed(weights, nil)
	err := m.reloadWeights(ctx, op)
	if err == nil {
		err = m.restoreWeights(ctx)
	}
	grew(before, committed(weights, nil))
	if err != nil {
		err = fmt.Errorf("%s: the weights: %w", op, err)
	}
	for _, c := range cs {
		if err != nil {
			break
		}
		if err = lockBounded(ctx, &c.mu); err != nil {
			err = fmt.Errorf("%s: context %s: %w", op, c.holder, err)
			break
		}
		before := committed(nil, []*Context{c})
		err = c.wakeLocked(ctx)
		grew(before, committed(nil, []*Context{c}))
		c.mu.Unlock()
		if err != nil {
			err = fmt.Errorf("%s: the KV cache of %s: %w", op, c.holder, err)
		}
	}
	if err == nil {
		m.mu.Lock()
		m.asleep, m.level = false, 0
		m.mu.Unlock()
	}
	m.emitMove("wake", level, taken, start, err)
	return err
}

// reloadWeights reloads every discarded region from the model file, or
// none: on a failure the ones it reloaded are decommitted again.
func (m *Model) reloadWeights(ctx context.Context, op string) error {
	m.mu.Lock()
	ws := m.discarded
	m.mu.Unlock()
	if len(ws) == 0 {
		return nil
	}
	f, err := m.openFile(op)
	if err != nil {
		return err
	}
	defer f.Close()
	for i, w := range ws {
		if err := m.reload(ctx, op, f, w); err != nil {
			uctx := context.WithoutCancel(ctx)
			for _, d := range ws[:i] {
				// A decommit that fails leaves a hole all the same (its
				// backing quarantined): the region stays to reload.
				err = errors.Join(err, d.reg.Decommit(uctx, memapi.Range{Len: d.size}))
			}
			return err
		}
	}
	m.mu.Lock()
	m.discarded = nil
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

// SleepState is how a model sleeps (Model.SleepState).
type SleepState struct {
	// Level is the sleep's level, 1 or 2; 0 when awake.
	Level int
	// Discarded is the weights' bytes a level-2 sleep decommitted, which
	// Wake reloads from the model file; Moved the weights' bytes waiting
	// in the host tier (every context's KV cache keeps its own).
	Discarded, Moved memapi.Bytes
	// Kept names, per weight region that a level-2 sleep moved instead of
	// discarding, the first tensor in it whose bytes are not the model
	// file's (empty at level 1, and when every weight is the file's).
	Kept []string
}

// SleepState reports how the model sleeps.
func (m *Model) SleepState() SleepState {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s SleepState
	if !m.asleep {
		return s
	}
	s.Level = m.level
	for _, w := range m.discarded {
		s.Discarded += w.size
	}
	for _, o := range m.sleeping {
		s.Moved += o.Bytes()
	}
	if m.level == 2 {
		for _, w := range m.bufs {
			if w.differs != "" {
				s.Kept = append(s.Kept, w.differs)
			}
		}
	}
	return s
}

// dropSleeping discards host copies of a context or model being closed:
// their ranges are freed with it.
func dropSleeping(offs []hostCopier) error {
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
