package cpu

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/internal/devctx"
)

// Context is the CPU device context: ordered streams, each run by one
// goroutine, whose copies are memmoves between host mappings of its
// Mechanism. Before each copy it asks the mechanism whether every byte of
// the source is backed and every byte of the destination writable, so a copy
// into a read-only view fails with ErrReadOnly and one into unbacked memory
// with ErrNotCommitted, changing nothing and never faulting. The copy runs
// while the mechanism's state is read-locked, so no decommit or unmap can
// pull pages from under it.
//
// Close the streams, then the context; no goroutine outlives them.
type Context struct {
	m       *Mechanism
	streams devctx.Streams[*Stream]
}

var _ memapi.DeviceContext = (*Context)(nil)

// NewContext returns a device context over the memory of m.
func NewContext(m *Mechanism) *Context {
	return &Context{m: m}
}

// NewContext returns a device context over the memory of m.
func (m *Mechanism) NewContext() *Context { return NewContext(m) }

// Device returns the host device of the context's mechanism.
func (c *Context) Device() memapi.DeviceKey { return c.m.info.Device }

// NewStream starts an ordered stream and its goroutine. It fails with
// ErrClosed after Close.
func (c *Context) NewStream() (memapi.Stream, error) {
	s, err := c.streams.Open(c.m.info.Mechanism, func() (*Stream, error) {
		s := &Stream{ctx: c, exited: make(chan struct{})}
		s.cond.L = &s.mu
		go s.run()
		return s, nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Close releases the context. It fails with ErrInUse while streams are
// open; a second Close returns nil.
func (c *Context) Close() error { return c.streams.Close(c.m.info.Mechanism) }

// Stream is an ordered queue of host copies run by one goroutine. Enqueuing
// never blocks; errors surface at the next fence (Record, Synchronize).
type Stream struct {
	ctx *Context

	mu      sync.Mutex
	cond    sync.Cond
	queue   []op
	closing bool
	exited  chan struct{}
	// pending is the first error since the last fence; only the worker
	// goroutine touches it.
	pending error
}

var _ memapi.Stream = (*Stream)(nil)

type opKind uint8

const (
	opToDevice opKind = iota
	opFromDevice
	opDevice
	opFence
)

type op struct {
	kind     opKind
	dst, src memapi.DeviceAddr
	n        memapi.Bytes
	buf      []byte
	fence    *Fence
}

// enqueue appends o, or fails with ErrClosed after Close.
func (s *Stream) enqueue(name string, o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return &memapi.Error{Op: "Stream." + name, Kind: memapi.ErrClosed, Mechanism: s.ctx.m.info.Mechanism}
	}
	s.queue = append(s.queue, o)
	s.cond.Signal()
	return nil
}

// CopyToDevice enqueues a copy of src to dst. src must not change until a
// later fence completes.
func (s *Stream) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	return s.enqueue("CopyToDevice", op{kind: opToDevice, dst: dst, buf: src, n: memapi.Bytes(len(src))})
}

// CopyFromDevice enqueues a copy of len(dst) bytes at src into dst.
func (s *Stream) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	return s.enqueue("CopyFromDevice", op{kind: opFromDevice, src: src, buf: dst, n: memapi.Bytes(len(dst))})
}

// CopyDevice enqueues a copy of n bytes from src to dst; the ranges may
// overlap (it is a memmove).
func (s *Stream) CopyDevice(dst, src memapi.DeviceAddr, n memapi.Bytes) error {
	return s.enqueue("CopyDevice", op{kind: opDevice, dst: dst, src: src, n: n})
}

// Record returns a fence that completes when the work enqueued so far has
// run. Its Wait returns the first error of the work between the previous
// fence of the stream (or its start) and this one.
func (s *Stream) Record() (memapi.Fence, error) {
	f, err := s.record("Record")
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (s *Stream) record(name string) (*Fence, error) {
	f := &Fence{done: make(chan struct{})}
	if err := s.enqueue(name, op{kind: opFence, fence: f}); err != nil {
		return nil, err
	}
	return f, nil
}

// Synchronize waits for all enqueued work and returns the first error since
// the previous fence.
func (s *Stream) Synchronize(ctx context.Context) error {
	f, err := s.record("Synchronize")
	if err != nil {
		return err
	}
	return f.Wait(ctx)
}

// Close runs the enqueued work, stops the stream's goroutine and returns the
// first error no fence reported. It is idempotent.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		<-s.exited
		return nil
	}
	s.closing = true
	s.cond.Signal()
	s.mu.Unlock()
	<-s.exited
	s.ctx.streams.Closed(s)
	return s.pending
}

// run is the stream's goroutine. A fault while copying (a mapping changed
// behind the mechanism's back) becomes an error, never a crash.
func (s *Stream) run() {
	defer close(s.exited)
	debug.SetPanicOnFault(true)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closing {
			s.cond.Wait()
		}
		batch := s.queue
		s.queue = nil
		s.mu.Unlock()
		if len(batch) == 0 {
			return // closing and drained
		}
		for i := range batch {
			s.exec(&batch[i])
			batch[i] = op{} // drop references to caller buffers
		}
	}
}

func (s *Stream) exec(o *op) {
	var err error
	m := s.ctx.m
	switch o.kind {
	case opFence:
		o.fence.err, s.pending = s.pending, nil
		close(o.fence.done)
		return
	case opToDevice:
		err = m.copyOut("Stream.CopyToDevice", o.dst, o.buf)
	case opFromDevice:
		err = m.copyIn("Stream.CopyFromDevice", o.buf, o.src)
	case opDevice:
		err = m.copyDevice("Stream.CopyDevice", o.dst, o.src, o.n)
	}
	if err != nil && s.pending == nil {
		s.pending = err
	}
}

// Fence completes when the work enqueued before it has run.
type Fence struct {
	done chan struct{}
	err  error // set before done is closed
}

var _ memapi.Fence = (*Fence)(nil)

// Done reports whether the fence completed.
func (f *Fence) Done() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the fence completes or ctx ends, and returns the first
// error of the work the fence covers (or ctx's error).
func (f *Fence) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		select {
		case <-f.done:
			return f.err
		default:
		}
		return ctx.Err()
	}
}

// Ready returns a channel closed when the fence completes.
func (f *Fence) Ready() <-chan struct{} { return f.done }

// span returns the host pointer for [addr, addr+n) after checking that
// every byte lies in one mapping of m, is backed, and (for a write) is
// writable. The caller holds m.mu for reading.
func (m *Mechanism) span(op string, addr memapi.DeviceAddr, n memapi.Bytes, write bool) (unsafe.Pointer, error) {
	end := uint64(addr) + uint64(n)
	rg := m.lookup(uint64(addr))
	if rg == nil || end < uint64(addr) || end-rg.base > rg.size {
		return nil, m.fail(op, memapi.ErrInvalidRange, 0, n, 0, "[%#x, +%#x) is not inside one mapping of this mechanism", uint64(addr), uint64(n))
	}
	off := uint64(addr) - rg.base
	if rg.res != nil {
		pos, offEnd := memapi.Bytes(off), memapi.Bytes(off)+n
		x := rg.res.backed
		for i := x.search(pos); i < len(x) && x[i].off < offEnd && pos < offEnd; i++ {
			if x[i].off > pos || x[i].kind == extCommitting {
				break
			}
			if write && x[i].kind == extView && x[i].view.access != memapi.AccessReadWrite {
				return nil, m.fail(op, memapi.ErrReadOnly, 0, n, 0, "[%#x, +%#x) is mapped by a read-only view", uint64(addr), uint64(n))
			}
			pos = x[i].end
		}
		if pos < offEnd {
			return nil, m.fail(op, memapi.ErrNotCommitted, 0, n, 0, "address %#x has no backing", rg.base+uint64(pos))
		}
	}
	return unsafe.Add(rg.ptr, off), nil
}

// copyOut copies src to addr.
func (m *Mechanism) copyOut(op string, addr memapi.DeviceAddr, src []byte) (err error) {
	if len(src) == 0 {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	p, err := m.span(op, addr, memapi.Bytes(len(src)), true)
	if err != nil {
		return err
	}
	defer m.recoverFault(op, &err)
	copy(bytesAt(p, uintptr(len(src))), src)
	return nil
}

// copyIn copies len(dst) bytes at addr into dst.
func (m *Mechanism) copyIn(op string, dst []byte, addr memapi.DeviceAddr) (err error) {
	if len(dst) == 0 {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	p, err := m.span(op, addr, memapi.Bytes(len(dst)), false)
	if err != nil {
		return err
	}
	defer m.recoverFault(op, &err)
	copy(dst, bytesAt(p, uintptr(len(dst))))
	return nil
}

// copyDevice moves n bytes from src to dst.
func (m *Mechanism) copyDevice(op string, dst, src memapi.DeviceAddr, n memapi.Bytes) (err error) {
	if n == 0 {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	ps, err := m.span(op, src, n, false)
	if err != nil {
		return err
	}
	pd, err := m.span(op, dst, n, true)
	if err != nil {
		return err
	}
	defer m.recoverFault(op, &err)
	copy(bytesAt(pd, uintptr(n)), bytesAt(ps, uintptr(n)))
	return nil
}

// recoverFault turns a memory fault during a copy (SetPanicOnFault) into an
// error; any other panic goes on.
func (m *Mechanism) recoverFault(op string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	re, ok := r.(runtime.Error)
	fa, hasAddr := r.(interface{ Addr() uintptr })
	if !ok || !hasAddr {
		panic(r)
	}
	*err = &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Mechanism: m.info.Mechanism,
		Detail: fmt.Sprintf("memory fault at %#x", fa.Addr()), Err: re}
}
