package ep

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
)

// leaks counts handles dropped without Close, process-wide.
var leaks atomic.Uint64

// Leaks returns how many owning handles were garbage collected without Close
// in this process. Each was still released through its queue.
func Leaks() uint64 { return leaks.Load() }

// Owned is an owning handle of memory made in a Context: it records the
// fences of the device work that used the memory and, on Close, schedules
// its release behind them. Layers above (pmm) embed it in their handles.
type Owned struct {
	s       *ownedState
	cleanup runtime.Cleanup
}

type ownedState struct {
	c       *Context
	name    string
	onClose func()
	free    func(ctx context.Context) error

	mu     sync.Mutex
	fences []memapi.Fence
	closed bool
}

// Own pins the context and returns an owning handle. onClose (optional) runs
// synchronously in Close, before the release is queued: the place to mark the
// lease pending-free. free runs on the queue after every recorded fence
// completed: it frees through the creating mechanism and refunds the ledger.
func (c *Context) Own(name string, onClose func(), free func(ctx context.Context) error) (*Owned, error) {
	if free == nil {
		return nil, memapi.Errorf("ep.Context.Own", memapi.ErrInvalidSize, "owned %q has no free function", name)
	}
	if err := c.Pin(); err != nil {
		return nil, err
	}
	s := &ownedState{c: c, name: name, onClose: onClose, free: free}
	o := &Owned{s: s}
	o.cleanup = runtime.AddCleanup(o, (*ownedState).leaked, s)
	return o, nil
}

// RecordUse records a fence of device work that uses the memory; the memory
// is freed only after it completes. It fails with memapi.ErrReleased after
// Close.
func (o *Owned) RecordUse(f memapi.Fence) error {
	if f == nil {
		return nil
	}
	s := o.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return memapi.Errorf("ep.Owned.RecordUse", memapi.ErrReleased, "%s was closed", s.name)
	}
	if len(s.fences) >= 8 { // keep the list short: completed fences order nothing
		keep := s.fences[:0]
		for _, g := range s.fences {
			if !g.Done() {
				keep = append(keep, g)
			}
		}
		for i := len(keep); i < len(s.fences); i++ {
			s.fences[i] = nil
		}
		s.fences = keep
	}
	s.fences = append(s.fences, f)
	return nil
}

// Closed reports whether Close was called.
func (o *Owned) Closed() bool {
	o.s.mu.Lock()
	defer o.s.mu.Unlock()
	return o.s.closed
}

// Close schedules the release behind the recorded fences and returns without
// waiting for the device. It is idempotent: later calls return nil.
func (o *Owned) Close() error {
	o.cleanup.Stop()
	return o.s.release()
}

func (s *ownedState) leaked() {
	leaks.Add(1)
	s.c.queue.mu.Lock()
	s.c.queue.stats.Leaked++
	s.c.queue.mu.Unlock()
	s.c.queue.log.Warn("memgen: owning handle dropped without Close; releasing it through the queue", slog.String("handle", s.name))
	if err := s.release(); err != nil {
		s.c.queue.log.Error("memgen: could not release leaked handle", slog.String("handle", s.name), slog.Any("err", err))
	}
}

func (s *ownedState) release() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	fences := s.fences
	s.fences = nil
	s.mu.Unlock()
	c := s.c
	// onClose (marking the lease pending) must happen before the free can
	// refund, and only once the release is really scheduled.
	marked := make(chan struct{})
	err := c.queue.Enqueue(Release{Name: s.name, Fences: fences, Free: func(ctx context.Context) error {
		<-marked
		if err := s.free(ctx); err != nil {
			return err // still held: stays pinned
		}
		c.Unpin()
		return nil
	}})
	if err != nil {
		// The queue is gone, which a pinned context prevents; should it
		// happen, the caller still owns the handle and nothing is lost.
		s.mu.Lock()
		s.closed = false
		s.fences = fences
		s.mu.Unlock()
		close(marked)
		return err
	}
	if s.onClose != nil {
		s.onClose()
	}
	close(marked)
	return nil
}

// Pending returns the recorded fences that have not completed yet: work that
// still uses the memory. Layers that release part of the memory early (a
// region shrinking) order that release behind these fences.
func (o *Owned) Pending() []memapi.Fence {
	s := o.s
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []memapi.Fence
	for _, f := range s.fences {
		if !f.Done() {
			out = append(out, f)
		}
	}
	return out
}
