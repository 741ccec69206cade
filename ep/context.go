package ep

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Context is a device context with its deferred-free queue and a count of
// the allocations alive in it (pins). It is the unit of release ordering.
type Context struct {
	dev   memapi.DeviceContext
	queue *Queue

	mu     sync.Mutex
	pins   int
	closed bool
	zero   chan struct{} // closedChan while pins == 0; nil while not, until a waiter makes it (zeroChan); closed when they reach 0
	// queueClosing is set by the queue's Close once it saw no pins: a
	// handle pinned after that could never be released.
	queueClosing bool

	// quarantine holds the handles whose release failed, not retried
	// yet: reachable from here even when their holder dropped them.
	quarantine map[*Lifecycle]struct{}
	// handles lists the lifecycles holding a pin, linked through their
	// prev and next (no allocation per handle): what Handles returns.
	handles *Lifecycle
}

// NewContext wraps dev and starts its deferred-free queue.
func NewContext(dev memapi.DeviceContext, opts Options) *Context {
	c := &Context{dev: dev, queue: NewQueue(opts), zero: closedChan}
	c.queue.owner = c
	return c
}

// Device returns the wrapped device context (streams, copies, fences).
func (c *Context) Device() memapi.DeviceContext { return c.dev }

// Queue returns the context's deferred-free queue.
func (c *Context) Queue() *Queue { return c.queue }

// Live returns how many allocations made in the context are alive: pinned
// and not yet freed.
func (c *Context) Live() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pins
}

// Quarantined returns how many handles made in the context are
// quarantined: their release failed, their memory is still held and they
// stay pinned until a retry frees them (a leftover the context refused to
// pin, see OwnQuarantined, is counted too, though it pins nothing).
func (c *Context) Quarantined() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.quarantine)
}

// QuarantineErrors returns the error of every quarantined handle's last
// failed release (each of kind ErrQuarantined, naming its handle).
func (c *Context) QuarantineErrors() []error {
	c.mu.Lock()
	ls := make([]*Lifecycle, 0, len(c.quarantine))
	for l := range c.quarantine {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	var errs []error
	for _, l := range ls {
		if err := l.Err(); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// RetryQuarantined queues the release of every quarantined handle again,
// including those their holder dropped; after Close it still frees the
// unpinned leftovers of OwnQuarantined, in the caller's goroutine.
func (c *Context) RetryQuarantined() error {
	c.mu.Lock()
	ls := make([]*Lifecycle, 0, len(c.quarantine))
	for l := range c.quarantine {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	var errs []error
	for _, l := range ls {
		errs = append(errs, l.Retry())
	}
	return errors.Join(errs...)
}

func (c *Context) setQuarantined(l *Lifecycle, on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !on {
		delete(c.quarantine, l)
		return
	}
	if c.quarantine == nil {
		c.quarantine = map[*Lifecycle]struct{}{}
	}
	c.quarantine[l] = struct{}{}
}

// pinState returns the pins and the channel closed when they reach zero.
func (c *Context) pinState() (int, chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pins, zeroChan(&c.zero)
}

// Pin records one more live allocation. It fails with memapi.ErrClosed after
// Close, and once the queue's Close began (see Queue.Close).
func (c *Context) Pin() error { return c.pinHandle(nil) }

// Handles returns the owning handles made in the context that still hold
// it: open, closing, pending or quarantined, in no particular order
// (newest first), plus the quarantined leftovers the context keeps
// unpinned (OwnQuarantined). Each names its handle (Lifecycle.Name). A
// test harness reports them as leaks at the end of a test.
func (c *Context) Handles() []*Lifecycle {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Lifecycle
	for l := c.handles; l != nil; l = l.next {
		out = append(out, l)
	}
	for l := range c.quarantine {
		if !l.pinned {
			out = append(out, l)
		}
	}
	return out
}

// Unpin records that a pinned allocation was freed.
func (c *Context) Unpin() { c.unpinHandle(nil) }

// Close closes the context. With allocations alive it fails with an error
// of kind memapi.ErrInUse carrying their count, unless wait is true: then it
// waits until they are all freed or ctx ends. It never frees underneath live
// allocations. After the pins reach zero it drains the queue, stops it and
// closes the device context. Close after a successful Close returns nil.
// Unpinned leftovers (OwnQuarantined) do not hold it: they stay listed in
// Quarantined for RetryQuarantined.
func (c *Context) Close(ctx context.Context, wait bool) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	pins, zero := c.pins, zeroChan(&c.zero)
	c.mu.Unlock()
	if pins > 0 {
		if !wait {
			return &memapi.Error{Op: "ep.Context.Close", Kind: memapi.ErrInUse, Detail: c.pinDetail(pins)}
		}
		select {
		case <-zero:
		case <-ctx.Done():
			return &memapi.Error{Op: "ep.Context.Close", Kind: memapi.ErrInUse, Detail: c.pinDetail(c.Live()), Err: ctx.Err()}
		}
	}
	c.mu.Lock()
	if c.pins > 0 { // pinned again meanwhile
		n := c.pins
		c.mu.Unlock()
		return &memapi.Error{Op: "ep.Context.Close", Kind: memapi.ErrInUse, Detail: c.pinDetail(n)}
	}
	c.closed = true
	c.mu.Unlock()
	if err := c.queue.Close(ctx); err != nil {
		c.mu.Lock()
		c.closed = false
		c.mu.Unlock()
		return err
	}
	if c.dev != nil {
		return c.dev.Close()
	}
	return nil
}

func (c *Context) pinDetail(n int) string {
	s := strconv.Itoa(n) + " allocations are still alive in this context"
	if n == 1 {
		s = "1 allocation is still alive in this context"
	}
	if q := c.Quarantined(); q > 0 {
		s += " (" + strconv.Itoa(q) + " quarantined: release failed, memory still held)"
	}
	return s
}

// closedChan is the channel of a count at zero (Context.zero, Queue.idle).
// A count that leaves zero sets its channel nil, and one that comes back
// closes it if a waiter made it (zeroChan) and sets closedChan again: a pin
// and its unpin, a release enqueued and run, allocate nothing when nobody
// waits. The channel is guarded by its owner's mutex.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// zeroChan returns *ch, the channel closed when its count is zero, made
// when a waiter is the first to ask while the count is not (nil).
func zeroChan(ch *chan struct{}) chan struct{} {
	if *ch == nil {
		*ch = make(chan struct{})
	}
	return *ch
}
