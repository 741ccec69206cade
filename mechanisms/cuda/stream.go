package cuda

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Stream is a CUstream of a Context. Copies run as synchronous driver copies
// (cuMemcpy*_v2) on the device thread, in the order they are enqueued; they
// are ordered with the CUstream's other work because the stream is a blocking
// one. A copy's error is kept and surfaces at Synchronize and at the fences
// recorded after it, as the contract says. Synchronous copies keep the Go
// buffers safe: a copy never outlives the call that passed its buffer.
type Stream struct {
	c      *Context
	h      driver.Stream
	mu     sync.Mutex
	err    error    // the first copy error since the last Synchronize
	fences []*Fence // fences not yet seen complete
	closed bool
}

var _ memapi.Stream = (*Stream)(nil)

// Handle returns the CUstream, for work an execution provider launches on it.
func (s *Stream) Handle() driver.Stream { return s.h }

// enqueue runs one copy in stream order and keeps its error.
func (s *Stream) enqueue(op string, run func() error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.c.m.fail(op, memapi.ErrClosed, nil, "stream closed")
	}
	if err := run(); err != nil && s.err == nil {
		s.err = err
	}
	return nil
}

// CopyToDevice copies src into device memory at dst (cuMemcpyHtoD_v2).
func (s *Stream) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	const op = "Stream.CopyToDevice"
	return s.enqueue(op, func() error {
		if len(src) == 0 {
			return nil
		}
		n := uint64(len(src))
		return s.c.m.copy(op, n, func(t *driver.Table) error {
			if err := check(t, "cuMemcpyHtoD_v2", t.MemcpyHtoD(driver.DevicePtr(dst), unsafe.Pointer(&src[0]), n)); err != nil {
				return err
			}
			s.c.m.dev.queued()
			return nil
		}, span{uint64(dst), true})
	})
}

// CopyFromDevice copies device memory at src into dst (cuMemcpyDtoH_v2).
func (s *Stream) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	const op = "Stream.CopyFromDevice"
	return s.enqueue(op, func() error {
		if len(dst) == 0 {
			return nil
		}
		n := uint64(len(dst))
		return s.c.m.copy(op, n, func(t *driver.Table) error {
			return check(t, "cuMemcpyDtoH_v2", t.MemcpyDtoH(unsafe.Pointer(&dst[0]), driver.DevicePtr(src), n))
		}, span{uint64(src), false})
	})
}

// CopyDevice copies n bytes between device addresses (cuMemcpyDtoD_v2).
func (s *Stream) CopyDevice(dst, src memapi.DeviceAddr, n memapi.Bytes) error {
	const op = "Stream.CopyDevice"
	return s.enqueue(op, func() error {
		if n == 0 {
			return nil
		}
		return s.c.m.copy(op, uint64(n), func(t *driver.Table) error {
			if err := check(t, "cuMemcpyDtoD_v2", t.MemcpyDtoD(driver.DevicePtr(dst), driver.DevicePtr(src), uint64(n))); err != nil {
				return err
			}
			s.c.m.dev.queued()
			return nil
		}, span{uint64(src), false}, span{uint64(dst), true})
	})
}

// Record returns a fence over the work enqueued so far: a CUevent
// (CU_EVENT_DISABLE_TIMING) recorded on the stream.
func (s *Stream) Record() (memapi.Fence, error) {
	const op = "Stream.Record"
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, s.c.m.fail(op, memapi.ErrClosed, nil, "stream closed")
	}
	f := &Fence{m: s.c.m, err: s.err}
	if err := s.c.m.dev.do(func(t *driver.Table) error {
		if err := check(t, "cuEventCreate", t.EventCreate(&f.ev, driver.EventDisableTiming)); err != nil {
			return err
		}
		if err := check(t, "cuEventRecord", t.EventRecord(f.ev, s.h)); err != nil {
			_ = t.EventDestroy(f.ev)
			return err
		}
		// The copies before it were synchronous, so the fence is often
		// complete already: find out in the same trip to the device thread.
		if t.EventQuery(f.ev) == driver.Success {
			f.finish(t, nil)
		}
		return nil
	}); err != nil {
		return nil, s.c.m.driverErr(op, err, 0)
	}
	live := s.fences[:0]
	for _, g := range s.fences {
		if !g.Done() {
			live = append(live, g)
		}
	}
	s.fences = append(live, f)
	return f, nil
}

// Synchronize waits for the work enqueued so far (through a fence, so ctx
// can end the wait without blocking the device thread) and returns the first
// copy error since the last Synchronize.
func (s *Stream) Synchronize(ctx context.Context) error {
	f, err := s.Record()
	if err != nil {
		return err
	}
	fence := f.(*Fence)
	if err := fence.await(ctx); err != nil {
		return fmt.Errorf("Stream.Synchronize: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err, s.err = s.err, nil
	if err == nil && fence.fault != nil {
		err = s.c.m.driverErr("Stream.Synchronize", fence.fault, 0)
	}
	return err
}

// Close waits for the stream's work (cuStreamSynchronize), completes its
// fences, and destroys it (cuStreamDestroy_v2). It is idempotent.
func (s *Stream) Close() error {
	s.mu.Lock()
	err := s.close()
	s.mu.Unlock()
	c := s.c
	c.mu.Lock()
	delete(c.streams, s)
	c.mu.Unlock()
	return err
}

// close does Close's work with s.mu held (or for Context.shutdown).
func (s *Stream) close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.c.m.dev.do(func(t *driver.Table) error {
		errSync := check(t, "cuStreamSynchronize", t.StreamSynchronize(s.h))
		for _, f := range s.fences {
			f.finish(t, errSync)
		}
		s.fences = nil
		errDestroy := check(t, "cuStreamDestroy_v2", t.StreamDestroy(s.h))
		if errSync != nil {
			return errSync
		}
		return errDestroy
	})
	if err != nil {
		return s.c.m.driverErr("Stream.Close", err, 0)
	}
	return nil
}
