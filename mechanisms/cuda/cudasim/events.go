package cudasim

import "github.com/memgen/memgen/mechanisms/cuda/driver"

// streamCreate is cuStreamCreate (flags CU_STREAM_DEFAULT or
// CU_STREAM_NON_BLOCKING; see memcpyDtoHAsync for what the second changes).
func (s *Sim) streamCreate(h *driver.Stream, flags uint32) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuStreamCreate", true)
	if r != driver.Success {
		return r
	}
	if h == nil || flags > 1 {
		return driver.ErrInvalidValue
	}
	id := driver.Stream(s.id())
	s.streams[id] = &stream{dev: d, nonBlocking: flags == driver.StreamNonBlocking}
	*h = id
	return driver.Success
}

// finish runs the work enqueued so far and completes the events recorded on
// st (every event for the legacy default stream 0, which synchronizes with
// all blocking streams). It returns the first fault of that work, or the
// sticky error.
func (s *Sim) finish(st driver.Stream) driver.Result {
	r := s.runAll()
	for _, e := range s.events {
		if e.recorded && (st == 0 || e.stream == st) {
			e.done = true
		}
	}
	s.cond.Broadcast()
	return r
}

// streamDestroy is cuStreamDestroy_v2. "In case the device is still doing
// work in the stream hStream when cuStreamDestroy() is called, the function
// will return immediately and the resources associated with hStream will be
// released automatically once the device has completed all work": the
// simulator completes the work at once (never stricter than the driver).
func (s *Sim) streamDestroy(h driver.Stream) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuStreamDestroy", true); r != driver.Success {
		return r
	}
	if _, ok := s.streams[h]; !ok {
		return driver.ErrInvalidHandle
	}
	s.finish(h)
	delete(s.streams, h)
	return driver.Success
}

// streamSynchronize is cuStreamSynchronize: "Waits until the device has
// completed all operations in the stream"; it reports a fault of that work.
func (s *Sim) streamSynchronize(h driver.Stream) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuStreamSynchronize", true); r != driver.Success {
		return r
	}
	if _, ok := s.streams[h]; !ok && h != 0 {
		return driver.ErrInvalidHandle
	}
	return s.finish(h)
}

// eventCreate is cuEventCreate.
func (s *Sim) eventCreate(h *driver.Event, flags uint32) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuEventCreate", true)
	if r != driver.Success {
		return r
	}
	if h == nil || !driver.EventFlagsValid(flags) {
		return driver.ErrInvalidValue
	}
	id := driver.Event(s.id())
	s.events[id] = &event{dev: d}
	*h = id
	return driver.Success
}

// eventRecord is cuEventRecord: the event completes when the work enqueued
// before it has run: when something waits for it, or in manual mode when the
// test says.
func (s *Sim) eventRecord(h driver.Event, st driver.Stream) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuEventRecord", true); r != driver.Success {
		return r
	}
	e, ok := s.events[h]
	if !ok {
		return driver.ErrInvalidHandle
	}
	if _, ok := s.streams[st]; !ok && st != 0 {
		return driver.ErrInvalidHandle
	}
	e.stream, e.recorded, e.done, e.seq = st, true, false, s.seq
	return driver.Success
}

// reach completes e unless the test completes events (manual mode): the
// device ran the work before it. It returns the first fault of that work.
func (s *Sim) reach(e *event) driver.Result {
	if s.cfg.ManualEvents || e.done {
		return s.sticky
	}
	r := s.runUntil(e.seq)
	e.done = true
	return r
}

// eventQuery is cuEventQuery: CUDA_ERROR_NOT_READY while pending; an event
// never recorded counts as complete, as on the driver. A fault of the work
// before the event is reported here ("may also return error codes from
// previous, asynchronous launches").
func (s *Sim) eventQuery(h driver.Event) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuEventQuery", true); r != driver.Success {
		return r
	}
	e, ok := s.events[h]
	if !ok {
		return driver.ErrInvalidHandle
	}
	if !e.recorded {
		return driver.Success
	}
	if r := s.reach(e); r != driver.Success {
		return r
	}
	if !e.done {
		return driver.ErrNotReady
	}
	return driver.Success
}

// eventSynchronize is cuEventSynchronize: it blocks the calling thread until
// the event completes and reports a fault of the work before it.
func (s *Sim) eventSynchronize(h driver.Event) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuEventSynchronize", true); r != driver.Success {
		return r
	}
	for {
		e, ok := s.events[h]
		if !ok {
			return driver.ErrInvalidHandle
		}
		if !e.recorded {
			return driver.Success
		}
		if r := s.reach(e); r != driver.Success {
			return r
		}
		if e.done {
			return s.sticky
		}
		s.cond.Wait()
	}
}

// eventDestroy is cuEventDestroy_v2.
func (s *Sim) eventDestroy(h driver.Event) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuEventDestroy", true); r != driver.Success {
		return r
	}
	if _, ok := s.events[h]; !ok {
		return driver.ErrInvalidHandle
	}
	delete(s.events, h)
	s.cond.Broadcast()
	return driver.Success
}
