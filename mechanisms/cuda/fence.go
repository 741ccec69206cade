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
// Every touch of the event happens on the device thread, so finish needs no
// lock: done changes once, there.
type Fence struct {
	dev  *device
	ev   driver.Event
	err  error // the first copy error of the work before the fence
	done atomic.Bool
}

// Done polls the fence without blocking (cuEventQuery).
func (f *Fence) Done() bool {
	if f.done.Load() {
		return true
	}
	err := f.dev.do(func(t *driver.Table) error {
		if !f.done.Load() && t.EventQuery(f.ev) != driver.ErrNotReady {
			// Complete, or failed for good (a sticky error): either way
			// nothing is left to wait for.
			f.finish(t)
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

// finish marks the fence complete and destroys its event, once; it runs on
// the device thread.
func (f *Fence) finish(t *driver.Table) {
	if f.done.CompareAndSwap(false, true) {
		_ = t.EventDestroy(f.ev)
	}
}

// Ready returns nil: a CUDA fence can only be polled.
func (f *Fence) Ready() <-chan struct{} { return nil }

// Poll intervals of Wait: short at first (most fences are near), then longer.
const (
	pollMin = 5 * time.Microsecond
	pollMax = time.Millisecond
)

// Wait blocks until the fence completes or ctx ends and returns the first
// error of the work it covers. With a context that can end it polls
// cuEventQuery, so it never holds the device thread; with one that cannot
// (context.Background) it blocks in cuEventSynchronize on the device thread.
func (f *Fence) Wait(ctx context.Context) error {
	if err := f.await(ctx); err != nil {
		return err
	}
	return f.err
}

// await waits for completion and returns only ctx's error.
func (f *Fence) await(ctx context.Context) error {
	if ctx.Done() == nil && !f.done.Load() {
		_ = f.dev.do(func(t *driver.Table) error {
			if !f.done.Load() && t.EventSynchronize(f.ev) == driver.Success {
				f.finish(t)
			}
			return nil
		})
	}
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
