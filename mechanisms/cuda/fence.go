package cuda

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Fence is a CUevent recorded on a stream. It completes when the work before
// it has run: cuEventQuery stops answering CUDA_ERROR_NOT_READY. The driver
// offers no completion callback without a host-function launch, so Ready
// returns nil and waiters poll. The event is destroyed as soon as the fence
// is seen complete (or its stream closes); the result is kept.
//
// A fence whose event query or synchronize fails (a sticky error such as
// CUDA_ERROR_ILLEGAL_ADDRESS: the work before it faulted and the context is
// lost) is complete, since nothing is left to wait for, and Wait returns that
// error: the work it covers did not run correctly.
//
// Every touch of the event happens on the device thread, so finish needs no
// lock: done changes once, there, after fault is set.
type Fence struct {
	m     *Mechanism
	ev    driver.Event
	err   error // the first copy error of the work before the fence
	fault error // the driver's error for the event, once done
	done  atomic.Bool
}

// Done polls the fence without blocking (cuEventQuery).
func (f *Fence) Done() bool {
	if f.done.Load() {
		return true
	}
	err := f.m.dev.do(func(t *driver.Table) error {
		if f.done.Load() {
			return nil
		}
		if r := t.EventQuery(f.ev); r != driver.ErrNotReady {
			f.finish(t, check(t, "cuEventQuery", r))
		}
		return nil
	})
	if err != nil {
		// The device thread has stopped: its streams were synchronized and
		// destroyed, so the work is over.
		f.done.Store(true)
	}
	return f.done.Load()
}

// finish marks the fence complete with the driver's error for its event
// (nil when the work ran) and destroys the event, once; it runs on the
// device thread.
func (f *Fence) finish(t *driver.Table, fault error) {
	if f.done.Load() {
		return
	}
	f.fault = fault
	f.done.Store(true)
	_ = t.EventDestroy(f.ev)
	f.m.dev.noteSticky(fault) // a fault seen only here loses the context too
}

// Ready returns nil: a CUDA fence can only be polled.
func (f *Fence) Ready() <-chan struct{} { return nil }

// Poll intervals of Wait: short at first (most fences are near), then longer.
const (
	pollMin = 5 * time.Microsecond
	pollMax = time.Millisecond
)

// Wait blocks until the fence completes or ctx ends and returns the first
// error of the work it covers: a copy's error, or the driver's (a fault of
// the work, of kind ErrUnavailable). It polls cuEventQuery, a short call on
// the device thread each time, with a backoff from 5 µs to 1 ms between
// polls, whatever ctx is: blocking in cuEventSynchronize would hold the
// device's one thread, and every driver call of the device (other
// mechanisms', the spare refiller's) would wait behind it.
func (f *Fence) Wait(ctx context.Context) error {
	if err := f.await(ctx); err != nil {
		return err
	}
	return f.result()
}

// result is the error of the completed fence: the copy error first, else the
// driver's error for the event.
func (f *Fence) result() error {
	if f.err != nil {
		return f.err
	}
	if f.fault != nil {
		return f.m.driverErr("Fence.Wait", f.fault, 0)
	}
	return nil
}

// await waits for completion, polling (see Wait), and returns only ctx's
// error.
func (f *Fence) await(ctx context.Context) error {
	d := pollMin
	var timer *time.Timer
	for !f.Done() {
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		d = min(2*d, pollMax)
	}
	return nil
}
