//go:build memgentmpl

package fakes

import (
	"context"
	"fmt"
	"slices"
	"sync"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// NewContext returns a fake device context over the host memory of m: its
// streams copy to and from the addresses of m's allocations, committed
// ranges and views. It records into m's Recorder.
//
// By default work runs synchronously, in order, when it is enqueued, and a
// recorded fence is already complete: no goroutine is ever started, so
// nothing outlives the context. Errors of the work surface at Synchronize and
// at the fences recorded after it, as the contract says. SetManualFences
// switches to test-controlled completion.
func NewContext(m *Mechanism) *Context {
	name := string(m.state.cfg.Name)
	c := &Context{source: name + ".context", rec: m.rec, quiet: m.quiet, faults: &faults{}}
	c.state.m = m
	c.state.self = c
	c.state.streams = map[*Stream]struct{}{}
	c.faults.init(c.source, mergeMethods(contextFaultMethods, streamFaultMethods, fenceFaultMethods))
	return c
}

func mergeMethods(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// contextState is the model behind Context. Faults injected into the context
// apply to its streams and fences too (they share one fault set, so Nth
// counts calls across all streams of the context).
type contextState struct {
	m        *Mechanism
	self     *Context
	mu       sync.Mutex
	manual   bool
	pollOnly bool
	closed   bool
	streams  map[*Stream]struct{}
	nstreams int
	nfences  int
}

// Device returns the fake mechanism's device.
func (s *contextState) Device() memapi.DeviceKey { return s.m.state.cfg.Device }

// NewStream opens a stream; it fails with ErrClosed after Close.
func (s *contextState) NewStream() (memapi.Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, &memapi.Error{
			Op:        "DeviceContext.NewStream",
			Kind:      memapi.ErrClosed,
			Mechanism: s.m.state.cfg.Name,
		}
	}
	s.nstreams++
	c := s.self
	st := &Stream{
		source: fmt.Sprintf("%s.stream#%d", s.m.state.cfg.Name, s.nstreams),
		rec:    c.rec,
		quiet:  c.quiet,
		faults: c.faults,
	}
	st.state.ctx = c
	st.state.progress = make(chan struct{})
	s.streams[st] = struct{}{}
	return st, nil
}

// Close closes the context; it fails with ErrInUse while streams are open
// and is idempotent.
func (s *contextState) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.streams); n > 0 {
		return &memapi.Error{
			Op:        "DeviceContext.Close",
			Kind:      memapi.ErrInUse,
			Mechanism: s.m.state.cfg.Name,
			Detail:    fmt.Sprintf("%d streams are open", n),
		}
	}
	s.closed = true
	return nil
}

// Mechanism returns the fake mechanism whose memory the context copies.
func (c *Context) Mechanism() *Mechanism { return c.state.m }

// SetManualFences switches completion control. When on, enqueued work waits:
// Fence.Complete runs the work its stream received before the fence, in
// order, and completes it (and the fences before it); CompleteAll runs all
// waiting work of every stream; Synchronize waits for one of those (or its
// ctx); Stream.Close runs what is left. When off (the default), work runs at
// enqueue; turning it off runs a stream's waiting work before its next
// enqueue, so order is kept.
func (c *Context) SetManualFences(on bool) {
	c.state.mu.Lock()
	c.state.manual = on
	c.state.mu.Unlock()
}

// SetPollOnlyFences makes fences recorded from now on return a nil Ready
// channel, like a device whose fences can only be polled.
func (c *Context) SetPollOnlyFences(on bool) {
	c.state.mu.Lock()
	c.state.pollOnly = on
	c.state.mu.Unlock()
}

// CompleteAll runs the waiting work of every open stream and completes its
// fences.
func (c *Context) CompleteAll() {
	c.state.mu.Lock()
	streams := make([]*Stream, 0, len(c.state.streams))
	for st := range c.state.streams {
		streams = append(streams, st)
	}
	c.state.mu.Unlock()
	slices.SortFunc(streams, func(a, b *Stream) int { return cmpString(a.source, b.source) })
	for _, st := range streams {
		st.state.drain(^uint64(0))
	}
}

func cmpString(a, b string) int {
	switch {
	case len(a) != len(b):
		return len(a) - len(b)
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (s *contextState) modes() (manual, pollOnly bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.manual, s.pollOnly
}

// item is one entry of a stream's queue: work, or a fence to complete.
type item struct {
	seq   uint64
	run   func() error
	fence *Fence
}

// streamState is the model behind Stream: an ordered queue over the
// mechanism's memory.
type streamState struct {
	ctx      *Context
	mu       sync.Mutex
	closed   bool
	queue    []item
	enq      uint64        // items enqueued
	done     uint64        // items run
	err      error         // first error since the last Synchronize
	progress chan struct{} // closed and replaced whenever queued work runs
}

// drain runs queued items up to seq (inclusive).
func (s *streamState) drain(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked(seq)
}

func (s *streamState) drainLocked(seq uint64) {
	if len(s.queue) == 0 || s.queue[0].seq > seq {
		return
	}
	for len(s.queue) > 0 && s.queue[0].seq <= seq {
		it := s.queue[0]
		s.queue = s.queue[1:]
		s.execute(it)
	}
	close(s.progress)
	s.progress = make(chan struct{})
}

func (s *streamState) execute(it item) {
	if it.run != nil {
		if err := it.run(); err != nil && s.err == nil {
			s.err = err
		}
	}
	if it.fence != nil {
		it.fence.state.complete(s.err)
	}
	s.done = it.seq
}

func (s *streamState) closedErr(op string) error {
	return &memapi.Error{
		Op:        op,
		Kind:      memapi.ErrClosed,
		Mechanism: s.ctx.state.m.state.cfg.Name,
		Detail:    "stream closed",
	}
}

// enqueue runs it now (automatic mode) or queues it (manual mode).
func (s *streamState) enqueue(op string, run func() error, f *Fence) error {
	manual, _ := s.ctx.state.modes()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.closedErr(op)
	}
	s.enq++
	it := item{seq: s.enq, run: run, fence: f}
	if manual {
		s.queue = append(s.queue, it)
		return nil
	}
	s.drainLocked(s.enq - 1)
	s.execute(it)
	return nil
}

// CopyToDevice copies src into the mechanism's memory at dst.
func (s *streamState) CopyToDevice(dst memapi.DeviceAddr, src []byte) error {
	const op = "Stream.CopyToDevice"
	m := &s.ctx.state.m.state
	return s.enqueue(op, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		segs, err := m.resolve(op, dst, uint64(len(src)), true, nil)
		if err != nil {
			return err
		}
		segs.write(src)
		return nil
	}, nil)
}

// CopyFromDevice copies the mechanism's memory at src into dst.
func (s *streamState) CopyFromDevice(dst []byte, src memapi.DeviceAddr) error {
	const op = "Stream.CopyFromDevice"
	m := &s.ctx.state.m.state
	return s.enqueue(op, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		segs, err := m.resolve(op, src, uint64(len(dst)), false, nil)
		if err != nil {
			return err
		}
		segs.read(dst)
		return nil
	}, nil)
}

// CopyDevice copies n bytes inside the mechanism's memory (overlap safe).
func (s *streamState) CopyDevice(dst memapi.DeviceAddr, src memapi.DeviceAddr, n memapi.Bytes) error {
	const op = "Stream.CopyDevice"
	m := &s.ctx.state.m.state
	return s.enqueue(op, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		from, err := m.resolve(op, src, uint64(n), false, nil)
		if err != nil {
			return err
		}
		to, err := m.resolve(op, dst, uint64(n), true, nil)
		if err != nil {
			return err
		}
		buf := make([]byte, n)
		from.read(buf)
		to.write(buf)
		return nil
	}, nil)
}

// Record enqueues a fence.
func (s *streamState) Record() (memapi.Fence, error) {
	c := s.ctx
	_, pollOnly := c.state.modes()
	c.state.mu.Lock()
	c.state.nfences++
	n := c.state.nfences
	c.state.mu.Unlock()
	f := &Fence{
		source: fmt.Sprintf("%s.fence#%d", c.state.m.state.cfg.Name, n),
		rec:    c.rec,
		quiet:  c.quiet,
		faults: c.faults,
	}
	f.state.stream = s
	f.state.pollOnly = pollOnly
	f.state.ready = make(chan struct{})
	if err := s.enqueue("Stream.Record", nil, f); err != nil {
		return nil, err
	}
	return f, nil
}

// Synchronize waits until the work enqueued before it has run, then returns
// and forgets the first error since the previous Synchronize.
func (s *streamState) Synchronize(ctx context.Context) error {
	const op = "Stream.Synchronize"
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.closedErr(op)
	}
	target := s.enq
	for s.done < target {
		ch := s.progress
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return &memapi.Error{
				Op:        op,
				Mechanism: s.ctx.state.m.state.cfg.Name,
				Detail:    "context done before the stream's work ran",
				Err:       ctx.Err(),
			}
		}
		s.mu.Lock()
	}
	err := s.err
	s.err = nil
	s.mu.Unlock()
	return err
}

// Close runs the waiting work, completes its fences and closes the stream.
// It is idempotent.
func (s *streamState) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.drainLocked(^uint64(0))
	s.closed = true
	s.mu.Unlock()
	c := s.ctx
	c.state.mu.Lock()
	for st := range c.state.streams {
		if &st.state == s {
			delete(c.state.streams, st)
		}
	}
	c.state.mu.Unlock()
	return nil
}

// fenceState is the model behind Fence.
type fenceState struct {
	stream   *streamState
	pollOnly bool
	once     sync.Once
	ready    chan struct{}
	err      error // set before ready closes
}

func (s *fenceState) complete(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.ready)
	})
}

// Done polls the fence.
func (s *fenceState) Done() bool {
	select {
	case <-s.ready:
		return true
	default:
		return false
	}
}

// Wait waits for the fence or ctx.
func (s *fenceState) Wait(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.err
	case <-ctx.Done():
		return &memapi.Error{
			Op:     "Fence.Wait",
			Detail: "context done before the fence completed",
			Err:    ctx.Err(),
		}
	}
}

// Ready returns the completion channel, or nil for a poll-only fence.
func (s *fenceState) Ready() <-chan struct{} {
	if s.pollOnly {
		return nil
	}
	return s.ready
}

// Complete runs the work its stream received before the fence, in order, and
// completes the fence (manual mode; a no-op for a completed fence).
func (f *Fence) Complete() {
	f.state.stream.drainTo(f)
}

func (s *streamState) drainTo(f *Fence) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range s.queue {
		if it.fence == f {
			s.drainLocked(it.seq)
			return
		}
	}
}
