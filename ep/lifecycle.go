package ep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
)

// ErrQuarantined is the kind of the error a handle reports when its release
// failed: the memory is still held by its mechanism and its bytes are still
// charged (the layer above books them quarantined, visible in the ledger),
// the context stays pinned, and Retry or a later Close tries again.
var ErrQuarantined = errors.New("ep: release failed; memory quarantined")

// leaks counts handles dropped without Close, process-wide.
var leaks atomic.Uint64

// Leaks returns how many owning handles were garbage collected without Close
// in this process. Each was still released through its queue.
func Leaks() uint64 { return leaks.Load() }

// State is where an owning handle is in its lifecycle:
//
//	Open ──Close──▶ Closing ──last End──▶ Pending ──free ok──▶ Released
//	                                         │  ▲
//	                                 free failed│  │Retry / Close
//	                                         ▼  │
//	                                      Quarantined
//
// Close of a handle with no transaction in flight passes through Closing at
// once.
type State uint8

const (
	// Open: usable; transactions may begin.
	Open State = iota
	// Closing: Close was called while transactions (or views) still hold
	// the handle; the release is scheduled when the last one ends.
	Closing
	// Pending: the release is queued behind the recorded fences.
	Pending
	// Quarantined: the release failed; the memory is still held and
	// charged. Retry (or Close) queues it again.
	Quarantined
	// Released: freed by its mechanism and refunded; the context unpinned.
	Released
)

func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case Closing:
		return "closing"
	case Pending:
		return "pending"
	case Quarantined:
		return "quarantined"
	case Released:
		return "released"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Releaser is what a layer above does at a handle's transitions: a layer
// whose state has them as methods hands itself over (pmm's buffer, region
// and shared backing states), with no closure to allocate. None of its
// methods may reach the handle the layer hands out (the object the leak
// backstop watches): they use the layer's state only.
type Releaser interface {
	// Closed runs once, in Close or the leak backstop, when the handle
	// leaves Open: the place to uncount it from its binding.
	Closed()
	// Pending runs once, when the release is about to be queued and
	// before Free can run: the place to mark the lease pending-free.
	Pending()
	// Free runs on the queue after every recorded fence completed: it
	// frees through the creating mechanism and refunds the ledger. An
	// error (or a panic, which the queue recovers) quarantines the
	// handle; Free is then called again by Retry and must free only what
	// is still held.
	Free(ctx context.Context) error
}

// Lifecycle is the state of one owning handle, written once for every kind
// of handle (pmm's Buffer, Region and Shared). It never refers to the
// handle the layer above hands out, so the leak backstop registered on that
// handle can run.
//
// Transactions (a region growing, a view of a shared backing) hold the
// handle open between Begin and End: Close during one moves the handle to
// Closing at once (new Begins fail with memapi.ErrClosed) and the release
// is scheduled when the last one ends, so a transaction is never cut in
// half.
type Lifecycle struct {
	c    *Context
	name string
	rel  Releaser
	// pinned: the lifecycle holds one of c's pins, which its release
	// returns. Only a leftover the context refused to pin (OwnQuarantined
	// on a closing context) holds none.
	pinned bool

	// prev and next link the pinned lifecycle into its context's list of
	// handles (Context.Handles), under the context's mutex.
	prev, next *Lifecycle

	origin Origin // what a leak report names (OwnFrom)

	mu     sync.Mutex
	state  State
	holds  int
	fences []memapi.Fence
	err    error // the last failed release
}

// Owned is an owning handle of memory made in a Context: the object the
// leak backstop watches, with its Lifecycle. Layers above (pmm) embed it in
// their handles.
type Owned struct {
	l       *Lifecycle
	cleanup runtime.Cleanup
}

// Own pins the context and returns an owning handle in state Open whose
// transitions call r. It is the one way to make an owning handle; a nil r
// is memapi.ErrInvalidSize, and a context that is closed or closing
// refuses the pin (memapi.ErrClosed).
func (c *Context) Own(name string, r Releaser) (*Owned, error) { return c.OwnFrom(name, r, Origin{}) }

// OwnFrom is Own for a handle whose origin a leak report names
// (Lifecycle.Origin).
func (c *Context) OwnFrom(name string, r Releaser, o Origin) (*Owned, error) {
	owned := new(Owned)
	if err := c.OwnIn(owned, name, r, o); err != nil {
		return nil, err
	}
	return owned, nil
}

// OwnIn is OwnFrom into an Owned the layer above embeds by value in its
// handle (pmm's Buffer, Region, Shared): the handle and its Owned are one
// allocation, and the leak backstop watches the handle. owned must be
// zero; it is left zero when OwnIn fails.
func (c *Context) OwnIn(owned *Owned, name string, r Releaser, o Origin) error {
	if r == nil {
		return memapi.Errorf("ep.Context.Own", memapi.ErrInvalidSize, "owned %q has no releaser", name)
	}
	if owned.l != nil {
		return memapi.Errorf("ep.Context.Own", memapi.ErrInvalidSize, "owned %q is already owning %s", name, owned.l.Name())
	}
	l := &Lifecycle{c: c, name: name, rel: r, pinned: true, origin: o}
	if err := c.pinHandle(l); err != nil {
		return err
	}
	owned.l = l
	owned.cleanup = runtime.AddCleanup(owned, (*Lifecycle).leaked, l)
	return nil
}

// pinHandle is Pin, for an owning handle l when l is not nil: it also
// links l into the list Handles walks, under the same lock.
func (c *Context) pinHandle(l *Lifecycle) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return memapi.Errorf("ep.Context.Pin", memapi.ErrClosed, "device context is closed")
	}
	if c.queueClosing {
		return memapi.Errorf("ep.Context.Pin", memapi.ErrClosed, "the device context's deferred-free queue is closing or closed")
	}
	if c.pins == 0 {
		c.zero = nil
	}
	c.pins++
	if l != nil {
		l.next = c.handles
		if c.handles != nil {
			c.handles.prev = l
		}
		c.handles = l
	}
	return nil
}

// unpinHandle is Unpin, for an owning handle l that pinHandle linked when
// l is not nil: it also unlinks l.
func (c *Context) unpinHandle(l *Lifecycle) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l != nil {
		if l.prev != nil {
			l.prev.next = l.next
		} else if c.handles == l {
			c.handles = l.next
		}
		if l.next != nil {
			l.next.prev = l.prev
		}
		l.prev, l.next = nil, nil
	}
	if c.pins == 0 {
		panic("ep: Unpin without Pin")
	}
	c.pins--
	if c.pins == 0 {
		if c.zero != nil {
			close(c.zero)
		}
		c.zero = closedChan
	}
}

// OwnQuarantined keeps memory that no handle owns any more because its
// rollback or its handoff failed (an allocation whose grant could not
// commit and which could not be freed back into it, or one the context
// refused to own and which could not be freed): a lifecycle born
// Quarantined with cause as its error, reachable from the context
// (Quarantined, QuarantineErrors), whose release r.Free tries when
// RetryQuarantined (or Retry) queues it. Closed and Pending are never
// called. Its bytes stay visible where the layer above booked them until
// the free succeeds.
//
// It pins the context, so the context cannot close under it. A context
// that refuses the pin (closed, or its queue closing) keeps it all the
// same, unpinned: the memory was never handed out, so no device work
// uses it and its release waits for no fence; once the queue no longer
// takes releases, RetryQuarantined runs it in the caller's goroutine.
func (c *Context) OwnQuarantined(name string, r Releaser, cause error) (*Lifecycle, error) {
	if r == nil {
		return nil, memapi.Errorf("ep.Context.OwnQuarantined", memapi.ErrInvalidSize, "%q has no releaser", name)
	}
	l := &Lifecycle{c: c, name: name, rel: r, pinned: true}
	if err := c.pinHandle(l); err != nil {
		l.pinned = false
		cause = errors.Join(cause, err)
	}
	l.quarantine(cause)
	return l, nil
}

// Lifecycle returns the handle's lifecycle, for the layer's own state to
// hold (it must not hold the Owned, or the backstop could never run).
func (o *Owned) Lifecycle() *Lifecycle { return o.l }

// RecordUse records a fence of device work that uses the memory; the memory
// is freed only after it completes. It fails with memapi.ErrReleased once
// the release is scheduled.
func (o *Owned) RecordUse(f memapi.Fence) error { return o.l.RecordUse(f) }

// Closed reports whether Close was called.
func (o *Owned) Closed() bool { return o.l.State() != Open }

// State returns where the handle is in its lifecycle.
func (o *Owned) State() State { return o.l.State() }

// Err returns the error of the handle's last failed release (of kind
// ErrQuarantined) while it is quarantined, else nil.
func (o *Owned) Err() error { return o.l.Err() }

// Pending returns the recorded fences that have not completed yet.
func (o *Owned) Pending() []memapi.Fence { return o.l.Pending() }

// Close schedules the release behind the recorded fences (or, while a
// transaction holds the handle, when it ends) and returns without waiting
// for the device. On a quarantined handle it retries the release. Otherwise
// later calls return nil.
func (o *Owned) Close() error {
	o.cleanup.Stop()
	return o.l.Close()
}

// Retry queues the release of a quarantined handle again; on any other
// handle it does nothing and returns nil.
func (o *Owned) Retry() error { return o.l.Retry() }

// Name returns the handle's name, as its errors and log lines give it
// (pmm's: "holder/role buffer 0x…"): the label it was made with and, when
// its Origin has one, its address.
func (l *Lifecycle) Name() string {
	if l.origin.Addr == 0 {
		return l.name
	}
	return l.name + " 0x" + strconv.FormatUint(l.origin.Addr, 16)
}

// State returns where the handle is in its lifecycle.
func (l *Lifecycle) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Err returns the last failed release's error while quarantined, else nil.
func (l *Lifecycle) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != Quarantined {
		return nil
	}
	return l.err
}

// RecordUse records a fence of device work that uses the memory. It fails
// with memapi.ErrReleased once the release is scheduled.
func (l *Lifecycle) RecordUse(f memapi.Fence) error {
	if f == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != Open && l.state != Closing {
		return memapi.Errorf("ep.Owned.RecordUse", memapi.ErrReleased, "%s was closed", l.Name())
	}
	l.addLocked(f)
	return nil
}

// addLocked records f, dropping completed fences once the list grows:
// completed fences order nothing, fences in flight all stay.
func (l *Lifecycle) addLocked(f memapi.Fence) {
	if len(l.fences) >= 8 {
		keep := l.fences[:0]
		for _, g := range l.fences {
			if !g.Done() {
				keep = append(keep, g)
			}
		}
		clear(l.fences[len(keep):])
		l.fences = keep
	}
	l.fences = append(l.fences, f)
}

// Pending returns the recorded fences that have not completed yet: work that
// still uses the memory. Layers that release part of the memory early (a
// region shrinking) order that release behind these fences.
func (l *Lifecycle) Pending() []memapi.Fence {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []memapi.Fence
	for _, f := range l.fences {
		if !f.Done() {
			out = append(out, f)
		}
	}
	return out
}

// Begin holds the handle open for a transaction (or a view). It fails with
// memapi.ErrClosed once Close was called.
func (l *Lifecycle) Begin(op string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != Open {
		return memapi.Errorf(op, memapi.ErrClosed, "%s is %v", l.Name(), l.state)
	}
	l.holds++
	return nil
}

// End ends a hold taken by Begin, recording fences of work that used the
// memory meanwhile (a release the transaction queued, a view's last use).
// The last End after Close schedules the release; its error is End's.
func (l *Lifecycle) End(fences ...memapi.Fence) error {
	l.mu.Lock()
	if l.holds == 0 {
		l.mu.Unlock()
		panic("ep: Lifecycle.End without Begin")
	}
	l.holds--
	for _, f := range fences {
		if f != nil && !f.Done() {
			l.addLocked(f)
		}
	}
	schedule := l.holds == 0 && l.state == Closing
	l.mu.Unlock()
	if schedule {
		return l.schedule()
	}
	return nil
}

// Close moves an open handle to Closing and, unless a transaction holds
// it, on to Pending with its release queued; on a quarantined handle it is
// Retry. The hooks run after the state moved: a panicking Closed or
// Pending hook still leaves the release queued (a Pending that did not run
// leaves the free to refund from the charged bytes), so nothing is lost;
// the panic goes on to the caller.
func (l *Lifecycle) Close() (err error) {
	l.mu.Lock()
	switch l.state {
	case Open:
	case Quarantined:
		l.mu.Unlock()
		return l.Retry()
	default:
		l.mu.Unlock()
		return nil
	}
	if l.holds != 0 {
		l.state = Closing // the last End schedules the release
		l.mu.Unlock()
		l.rel.Closed()
		return nil
	}
	l.state = Pending
	fences := l.fences
	l.fences = nil
	l.mu.Unlock()
	defer func() { err = l.enqueue(fences) }()
	l.rel.Closed()
	l.rel.Pending()
	return nil
}

// schedule moves a closing handle whose last hold ended to Pending and
// queues its release. A panicking Pending hook still queues it (the free then refunds
// from the charged bytes), and the panic goes on.
func (l *Lifecycle) schedule() (err error) {
	l.mu.Lock()
	l.state = Pending
	fences := l.fences
	l.fences = nil
	l.mu.Unlock()
	defer func() { err = l.enqueue(fences) }()
	l.rel.Pending()
	return nil
}

// Retry queues the release of a quarantined handle again.
func (l *Lifecycle) Retry() error {
	l.mu.Lock()
	if l.state != Quarantined {
		l.mu.Unlock()
		return nil
	}
	l.state = Pending
	l.c.setQuarantined(l, false) // under l.mu: see quarantine
	l.mu.Unlock()
	return l.enqueue(nil)
}

func (l *Lifecycle) enqueue(fences []memapi.Fence) error {
	err := l.c.queue.submit(job{rel: Release{Fences: fences}, owner: l})
	if err != nil && !l.pinned && len(fences) == 0 {
		// An unpinned leftover on a context whose queue no longer takes
		// releases: nothing to wait for, so it runs here.
		l.c.queue.runUnqueued(job{owner: l})
		return nil
	}
	if err != nil {
		// A pinned context keeps its queue open, so this is not expected;
		// should it happen, nothing is lost: the handle is quarantined.
		l.quarantine(err)
		return &memapi.Error{Op: "ep.Owned.Close", Kind: ErrQuarantined, Detail: l.Name(), Err: err}
	}
	return nil
}

// ended settles the handle once the queue ran its release (Release.Ended):
// released, unpinned, when the free succeeded; quarantined with err when it
// failed or panicked (the queue recovers a panic there: it serves every
// context's releases and must not die).
func (l *Lifecycle) ended(err error) {
	if err != nil {
		l.quarantine(err)
		return
	}
	l.mu.Lock()
	l.state, l.err = Released, nil
	l.mu.Unlock()
	if l.pinned {
		l.c.unpinHandle(l)
	}
}

// quarantine marks the handle quarantined and lists it in its context's
// quarantine, both under l.mu (the context's lock comes after it): a Retry
// that sees the state, as soon as it is set, also finds the listing, so
// the listing it removes is never added back behind it, which counted a
// released handle quarantined forever.
func (l *Lifecycle) quarantine(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state = Quarantined
	l.err = &memapi.Error{Op: "ep.release", Kind: ErrQuarantined, Detail: l.Name(), Err: err}
	l.c.setQuarantined(l, true)
}

func (l *Lifecycle) leaked() {
	l.mu.Lock()
	open := l.state == Open
	l.mu.Unlock()
	if !open {
		return
	}
	leaks.Add(1)
	q := l.c.queue
	q.mu.Lock()
	q.stats.Leaked++
	q.mu.Unlock()
	q.log.Warn("memgen: owning handle dropped without Close; releasing it through the queue", slog.String("handle", l.Name()))
	if err := l.Close(); err != nil {
		q.log.Error("memgen: could not release leaked handle", slog.String("handle", l.Name()), slog.Any("err", err))
	}
}

// Holds returns how many transactions (or views) hold the handle now.
func (l *Lifecycle) Holds() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holds
}
