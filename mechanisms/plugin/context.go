package plugin

import (
	"context"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/internal/devctx"
)

// Context is the device context of a plugin instance, made of the plugin's
// stream and fence slots: the plugin knows which bytes are backed and
// writable, so it alone can copy safely (a copy into a read-only view fails
// with ErrReadOnly instead of faulting). Fences are polled (fence_done);
// Fence.Ready is nil. Close the streams, then the context; the context does
// not close the mechanism.
type Context struct {
	m       *Mechanism
	streams devctx.Streams[*Stream]
}

var (
	_ memapi.DeviceContext = (*Context)(nil)
	_ memapi.Stream        = (*Stream)(nil)
	_ memapi.Fence         = (*Fence)(nil)
)

// NewContext returns the device context of m. It fails with ErrUnsupported
// when the plugin has no device-context slots.
func (m *Mechanism) NewContext() (*Context, error) {
	if !m.lib.context {
		return nil, &memapi.Error{Op: "plugin.NewContext", Kind: memapi.ErrUnsupported, Mechanism: m.info.Mechanism,
			Detail: "the plugin has no device_context slots"}
	}
	return &Context{m: m}, nil
}

// Device returns the plugin's device.
func (c *Context) Device() memapi.DeviceKey { return c.m.info.Device }

// NewStream calls stream_create. It fails with ErrClosed after Close.
func (c *Context) NewStream() (memapi.Stream, error) {
	s, err := c.streams.Open(c.m.info.Mechanism, c.newStream)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// newStream calls stream_create, under the lock of the context's streams.
func (c *Context) newStream() (*Stream, error) {
	const op = "DeviceContext.NewStream"
	m := c.m
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.leave()
	var id uint64
	if err := m.slot(op, 0, 0, m.lib.dc.StreamCreate, m.inst, uintptr(unsafe.Pointer(&id))); err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, m.protocol(op, 0, "stream_create returned stream id 0")
	}
	return &Stream{c: c, id: id}, nil
}

// Close releases the context. It fails with ErrInUse while streams are open;
// a second Close returns nil.
func (c *Context) Close() error { return c.streams.Close(c.m.info.Mechanism) }

// Stream is one plugin stream. It is used from one goroutine at a time, as
// the ABI promises the plugin: its methods serialize on a mutex.
type Stream struct {
	c  *Context
	id uint64

	mu     sync.Mutex
	closed bool
}

// call runs a slot of this stream; args follow the instance and stream id.
//
//go:uintptrescapes
func (s *Stream) call(op string, fn uintptr, args ...uintptr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.c.m
	if s.closed {
		return &memapi.Error{Op: op, Kind: memapi.ErrClosed, Mechanism: m.info.Mechanism}
	}
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.leave()
	all := append([]uintptr{m.inst, uintptr(s.id)}, args...)
	return m.slot(op, 0, 0, fn, all...)
}

// CopyToDevice calls stream_copy_to_device. src is borrowed until the next
// fence of the stream completes. With Options.GuardPages the plugin reads a
// guarded copy of src, and the copy is synchronized before it returns.
func (s *Stream) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	const op = "Stream.CopyToDevice"
	if s.c.m.guard {
		return s.guardedCopy(op, len(src), func(g *guardBuf) error {
			copy(g.bytes(), src)
			return s.call(op, s.c.m.lib.dc.StreamCopyToDevice, uintptr(dst), uintptr(g.ptr()), uintptr(len(src)))
		}, nil)
	}
	return s.call(op, s.c.m.lib.dc.StreamCopyToDevice, uintptr(dst),
		uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)))
}

// CopyFromDevice calls stream_copy_from_device. With Options.GuardPages the
// plugin writes a guarded buffer, which the host copies into dst once the
// stream is synchronized, before it returns.
func (s *Stream) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	const op = "Stream.CopyFromDevice"
	if s.c.m.guard {
		return s.guardedCopy(op, len(dst), func(g *guardBuf) error {
			return s.call(op, s.c.m.lib.dc.StreamCopyFromDevice, uintptr(g.ptr()), uintptr(len(dst)), uintptr(src))
		}, func(g *guardBuf) { copy(dst, g.bytes()) })
	}
	err := s.call(op, s.c.m.lib.dc.StreamCopyFromDevice,
		uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(len(dst)), uintptr(src))
	runtime.KeepAlive(dst)
	return err
}

// guardedCopy runs a copy slot on an n-byte guarded buffer (call), then
// stream_synchronize, so the plugin is done with the buffer, then done, and
// releases the buffer. A copy's error surfaces here rather than at a later
// synchronize, as a synchronous stream's would.
func (s *Stream) guardedCopy(op string, n int, call func(*guardBuf) error, done func(*guardBuf)) error {
	g, err := newGuardBuf(n)
	if err != nil {
		return &memapi.Error{Op: op, Kind: memapi.ErrOutOfMemory, Mechanism: s.c.m.info.Mechanism, Detail: "mapping a guarded buffer", Err: err}
	}
	defer g.free()
	if err := call(g); err != nil {
		return err
	}
	if err := s.call(op, s.c.m.lib.dc.StreamSynchronize); err != nil {
		return err
	}
	if done != nil {
		done(g)
	}
	return nil
}

// CopyDevice calls stream_copy_device.
func (s *Stream) CopyDevice(dst, src memapi.DeviceAddr, n memapi.Bytes) error {
	return s.call("Stream.CopyDevice", s.c.m.lib.dc.StreamCopyDevice, uintptr(dst), uintptr(src), uintptr(n))
}

// Record calls stream_record and returns the new fence.
func (s *Stream) Record() (memapi.Fence, error) {
	var id uint64
	m := s.c.m
	if err := s.call("Stream.Record", m.lib.dc.StreamRecord, uintptr(unsafe.Pointer(&id))); err != nil {
		return nil, err
	}
	if id == 0 {
		return nil, m.protocol("Stream.Record", 0, "stream_record returned fence id 0")
	}
	f := &Fence{m: m, id: id}
	// A C fence has no garbage collector: release it with the Go value.
	runtime.AddCleanup(f, func(id uint64) { m.releaseFence(id) }, id)
	return f, nil
}

// Synchronize calls stream_synchronize. The slot does not block without
// bound (the ABI forbids it), so ctx is checked only before the call.
func (s *Stream) Synchronize(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.call("Stream.Synchronize", s.c.m.lib.dc.StreamSynchronize)
}

// Close synchronizes and calls stream_close. It is idempotent.
func (s *Stream) Close() error {
	syncErr := s.call("Stream.Close", s.c.m.lib.dc.StreamSynchronize)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	m := s.c.m
	var err error
	if m.enter("Stream.Close") == nil {
		err = m.slotInts("Stream.Close", 0, 0, m.lib.dc.StreamClose, m.inst, uintptr(s.id))
		m.leave()
	}
	s.closed = true
	s.mu.Unlock()
	s.c.streams.Closed(s)
	if err != nil {
		return err
	}
	return syncErr
}

// releaseFence calls fence_release, unless the instance is closed (its close
// freed every fence).
func (m *Mechanism) releaseFence(id uint64) {
	if m.enter("Fence.release") != nil {
		return
	}
	defer m.leave()
	_, _ = m.call(m.lib.dc.FenceRelease, m.inst, uintptr(id))
}

// Fence is a plugin fence, polled through fence_done.
type Fence struct {
	m  *Mechanism
	id uint64
}

// poll calls fence_done: whether the fence completed, and the first error of
// the work it covers once it did.
func (f *Fence) poll() (bool, error) {
	const op = "Fence.Done"
	if err := f.m.enter(op); err != nil {
		return true, err
	}
	defer f.m.leave()
	var done int32
	err := f.m.slot(op, 0, 0, f.m.lib.dc.FenceDone, f.m.inst, uintptr(f.id), uintptr(unsafe.Pointer(&done)))
	runtime.KeepAlive(f)
	if err != nil {
		return true, err
	}
	return done != 0, nil
}

// Done polls the fence without blocking.
func (f *Fence) Done() bool {
	done, _ := f.poll()
	return done
}

// Wait polls fence_done, backing off from 1 µs to 1 ms, until the fence
// completes or ctx ends; it returns the first error of the work the fence
// covers.
func (f *Fence) Wait(ctx context.Context) error {
	delay := time.Microsecond
	for {
		done, err := f.poll()
		if done {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, time.Millisecond)
	}
}

// Ready returns nil: plugin fences can only be polled.
func (f *Fence) Ready() <-chan struct{} { return nil }
