package conformancetest

import (
	"context"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Context is the device context of an in-memory Mechanism. Its streams run
// each copy when it is enqueued; a copy's error surfaces at the next
// Synchronize and at the fences recorded after it.
type Context struct {
	m       *Mechanism
	mu      sync.Mutex
	streams int
	closed  bool
}

var _ memapi.DeviceContext = (*Context)(nil)

// NewContext returns the device context of m.
func NewContext(m *Mechanism) *Context { return &Context{m: m} }

// Device returns the mechanism's device.
func (c *Context) Device() memapi.DeviceKey { return c.m.info.Device }

// NewStream creates a stream.
func (c *Context) NewStream() (memapi.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, memapi.Errorf("DeviceContext.NewStream", memapi.ErrClosed, "context closed")
	}
	c.streams++
	return &stream{c: c}, nil
}

// Close releases the context; it fails with ErrInUse while streams are open.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams > 0 {
		return memapi.Errorf("DeviceContext.Close", memapi.ErrInUse, "%d streams open", c.streams)
	}
	c.closed = true
	return nil
}

type stream struct {
	c      *Context
	mu     sync.Mutex
	err    error // first error since the last Synchronize
	closed bool
}

func (s *stream) note(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return memapi.Errorf("Stream", memapi.ErrClosed, "stream closed")
	}
	if err != nil && s.err == nil {
		s.err = err
	}
	return nil
}

func (s *stream) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	return s.note(s.c.m.copyIn(dst, src))
}

func (s *stream) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	return s.note(s.c.m.copyOut(dst, src))
}

func (s *stream) CopyDevice(dst, src memapi.DeviceAddr, n memapi.Bytes) error {
	buf := make([]byte, n)
	err := s.c.m.copyOut(buf, src)
	if err == nil {
		err = s.c.m.copyIn(dst, buf)
	}
	return s.note(err)
}

func (s *stream) Record() (memapi.Fence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, memapi.Errorf("Stream.Record", memapi.ErrClosed, "stream closed")
	}
	return fence{err: s.err}, nil
}

func (s *stream) Synchronize(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

func (s *stream) Close() error {
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

// fence is complete when recorded: the work before it ran at enqueue.
type fence struct{ err error }

var done = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (f fence) Done() bool                 { return true }
func (f fence) Wait(context.Context) error { return f.err }
func (f fence) Ready() <-chan struct{}     { return done }
