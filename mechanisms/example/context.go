package example

import (
	"context"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Context is the example's device context: streams whose copies move bytes
// between Go slices and the mechanism's allocations. A copy runs when it is
// enqueued; its error surfaces, as the contract says, at the next fence and
// at Synchronize.
type Context struct {
	m *Mechanism

	mu      sync.Mutex
	streams int
	closed  bool
}

var _ memapi.DeviceContext = (*Context)(nil)

// NewContext returns a device context over the memory of m.
func NewContext(m *Mechanism) *Context { return &Context{m: m} }

// Device returns the mechanism's device.
func (c *Context) Device() memapi.DeviceKey { return c.m.info.Device }

// NewStream returns a new stream; it fails with ErrClosed after Close.
func (c *Context) NewStream() (memapi.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, c.m.fail("DeviceContext.NewStream", memapi.ErrClosed, "the context is closed")
	}
	c.streams++
	return &Stream{c: c}, nil
}

// Close releases the context. It fails with ErrInUse while streams are open.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams > 0 {
		return c.m.fail("DeviceContext.Close", memapi.ErrInUse, "%d streams are open", c.streams)
	}
	c.closed = true
	return nil
}

// Stream is an ordered queue of copies of one Context. Copies run in order
// as they are enqueued, so every fence is complete when it is recorded.
type Stream struct {
	c *Context

	mu     sync.Mutex
	err    error // the first error since the last Synchronize
	closed bool
}

// CopyToDevice copies src to the allocation bytes at dst.
func (s *Stream) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	return s.run("Stream.CopyToDevice", func(m *Mechanism) error {
		d, err := m.bytesAt("Stream.CopyToDevice", dst, memapi.Bytes(len(src)))
		if err == nil {
			copy(d, src)
		}
		return err
	})
}

// CopyFromDevice copies the allocation bytes at src to dst.
func (s *Stream) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	return s.run("Stream.CopyFromDevice", func(m *Mechanism) error {
		b, err := m.bytesAt("Stream.CopyFromDevice", src, memapi.Bytes(len(dst)))
		if err == nil {
			copy(dst, b)
		}
		return err
	})
}

// CopyDevice copies n bytes between allocations (or within one; the ranges
// may overlap).
func (s *Stream) CopyDevice(dst, src memapi.DeviceAddr, n memapi.Bytes) error {
	return s.run("Stream.CopyDevice", func(m *Mechanism) error {
		from, err := m.bytesAt("Stream.CopyDevice", src, n)
		if err != nil {
			return err
		}
		to, err := m.bytesAt("Stream.CopyDevice", dst, n)
		if err == nil {
			copy(to, from)
		}
		return err
	})
}

// run performs one copy under the mechanism's read lock, so no Free can
// take the memory from under it, and keeps its error for the next fence.
func (s *Stream) run(op string, copyFn func(m *Mechanism) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.c.m.fail(op, memapi.ErrClosed, "the stream is closed")
	}
	m := s.c.m
	m.mu.RLock()
	err := copyFn(m)
	m.mu.RUnlock()
	if err != nil && s.err == nil {
		s.err = err
	}
	return nil
}

// Record returns a fence over the work enqueued so far: already complete,
// carrying the first error since the last Synchronize.
func (s *Stream) Record() (memapi.Fence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.c.m.fail("Stream.Record", memapi.ErrClosed, "the stream is closed")
	}
	return &Fence{err: s.err}, nil
}

// Synchronize returns the first error of the work enqueued since the last
// Synchronize, and forgets it.
func (s *Stream) Synchronize(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// Close releases the stream. It is idempotent.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.c.mu.Lock()
	s.c.streams--
	s.c.mu.Unlock()
	return nil
}

// Fence is a fence of a Stream; copies run as they are enqueued, so it is
// complete from the start.
type Fence struct{ err error }

// done is the closed channel every Fence returns from Ready.
var done = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done reports true: the fence is complete.
func (f *Fence) Done() bool { return true }

// Wait returns the first error of the work the fence covers.
func (f *Fence) Wait(ctx context.Context) error { return f.err }

// Ready returns a closed channel.
func (f *Fence) Ready() <-chan struct{} { return done }
