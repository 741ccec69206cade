package example

import (
	"context"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Context is the example's device context: streams whose copies move bytes
// between Go slices and the memory behind the mechanism's addresses
// (allocations, committed granules, mapped views). A copy runs when it is
// enqueued; its error surfaces, as the contract says, at the next
// Synchronize and at the fences recorded after it.
type Context struct {
	m       *Mechanism
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
		return nil, c.m.errorf("DeviceContext.NewStream", memapi.ErrClosed, "the context is closed")
	}
	c.streams++
	return &stream{c: c}, nil
}

// Close releases the context. It fails with ErrInUse while streams are open.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams > 0 {
		return c.m.errorf("DeviceContext.Close", memapi.ErrInUse, "%d streams are open", c.streams)
	}
	c.closed = true
	return nil
}

// stream is an ordered queue of copies of one Context. Copies run in order
// as they are enqueued, so every fence is complete when it is recorded.
type stream struct {
	c      *Context
	mu     sync.Mutex
	err    error // the first error since the last Synchronize
	closed bool
}

// note keeps the error of a copy that ran for the next fence; a copy on a
// closed stream fails at once with ErrClosed.
func (s *stream) note(op string, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.c.m.errorf(op, memapi.ErrClosed, "the stream is closed")
	}
	if err != nil && s.err == nil {
		s.err = err
	}
	return nil
}

// CopyToDevice copies src to the memory at dst.
func (s *stream) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	const op = "Stream.CopyToDevice"
	return s.note(op, s.c.m.copyIn(op, dst, src))
}

// CopyFromDevice copies the memory at src to dst.
func (s *stream) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	const op = "Stream.CopyFromDevice"
	return s.note(op, s.c.m.copyOut(op, dst, src))
}

// CopyDevice copies n bytes from src to dst (the ranges may overlap: the
// bytes go through a buffer).
func (s *stream) CopyDevice(dst, src memapi.DeviceAddr, n memapi.Bytes) error {
	const op = "Stream.CopyDevice"
	buf := make([]byte, n)
	err := s.c.m.copyOut(op, buf, src)
	if err == nil {
		err = s.c.m.copyIn(op, dst, buf)
	}
	return s.note(op, err)
}

// Record returns a fence over the work enqueued so far: already complete,
// carrying the first error since the last Synchronize.
func (s *stream) Record() (memapi.Fence, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.c.m.errorf("Stream.Record", memapi.ErrClosed, "the stream is closed")
	}
	return fence{err: s.err}, nil
}

// Synchronize returns the first error of the work enqueued since the last
// Synchronize, and forgets it.
func (s *stream) Synchronize(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// Close releases the stream. It is idempotent.
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

// fence is a fence of a stream; copies run as they are enqueued, so it is
// complete when recorded.
type fence struct{ err error }

// done is the closed channel every fence returns from Ready.
var done = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (f fence) Done() bool                 { return true }
func (f fence) Wait(context.Context) error { return f.err }
func (f fence) Ready() <-chan struct{}     { return done }

// segments resolves [addr, addr+n) to the memory behind it, for a copy. A
// write into a read-only view fails with ErrReadOnly, an address with no
// backing with ErrNotCommitted (inside a reservation) or ErrInvalidRange.
// Nothing is copied unless every part resolves. The caller holds m.mu, so
// no Free or Decommit takes the memory from under the copy.
func (m *Mechanism) segments(op string, addr memapi.DeviceAddr, n memapi.Bytes, write bool) ([][]byte, error) {
	if n == 0 {
		return nil, nil
	}
	for _, ar := range m.areas {
		start, size := ar.span()
		if addr < start || uint64(addr-start) >= uint64(size) {
			continue
		}
		off := memapi.Bytes(addr - start)
		if off+n > size || off+n < off {
			return nil, m.errorf(op, memapi.ErrInvalidRange, "[%#x, +%d) runs past the end of its area", addr, n)
		}
		switch ar := ar.(type) {
		case *allocation:
			return [][]byte{ar.data[off : off+n]}, nil
		case *reservation:
			g := m.info.Granularity
			var out [][]byte
			for n > 0 {
				i, in := off/g, off%g
				k := min(n, g-in)
				s := ar.slots[i]
				switch {
				case s.data != nil:
					out = append(out, s.data[in:in+k])
				case s.view != nil:
					if write && s.view.access != memapi.AccessReadWrite {
						return nil, m.errorf(op, memapi.ErrReadOnly, "write into a read-only view at %#x", addr)
					}
					vo := off - s.view.r.Off
					out = append(out, s.view.b.data[vo:vo+k])
				default:
					return nil, m.errorf(op, memapi.ErrNotCommitted, "no backing at %#x", start+memapi.DeviceAddr(off))
				}
				off, n = off+k, n-k
			}
			return out, nil
		}
	}
	return nil, m.errorf(op, memapi.ErrInvalidRange, "no memory at %#x", addr)
}

// copyIn writes src at dst.
func (m *Mechanism) copyIn(op string, dst memapi.DeviceAddr, src []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	segs, err := m.segments(op, dst, memapi.Bytes(len(src)), true)
	if err != nil {
		return err
	}
	for _, s := range segs {
		src = src[copy(s, src):]
	}
	return nil
}

// copyOut reads len(dst) bytes at src.
func (m *Mechanism) copyOut(op string, dst []byte, src memapi.DeviceAddr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	segs, err := m.segments(op, src, memapi.Bytes(len(dst)), false)
	if err != nil {
		return err
	}
	for _, s := range segs {
		dst = dst[copy(dst, s):]
	}
	return nil
}
