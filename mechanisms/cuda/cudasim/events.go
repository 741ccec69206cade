package cudasim

import "github.com/memgen/memgen/mechanisms/cuda/driver"

// streamCreate is cuStreamCreate (flags CU_STREAM_DEFAULT or NON_BLOCKING).
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
	s.streams[id] = &stream{dev: d}
	*h = id
	return driver.Success
}

// finish completes the events recorded on st (every event for the legacy
// default stream 0, which synchronizes with all blocking streams).
func (s *Sim) finish(st driver.Stream) {
	for _, e := range s.events {
		if e.recorded && (st == 0 || e.stream == st) {
			e.done = true
		}
	}
	s.cond.Broadcast()
}

// streamDestroy is cuStreamDestroy_v2: the stream's work completes, then it is gone.
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

// streamSynchronize is cuStreamSynchronize: the work before it has run.
func (s *Sim) streamSynchronize(h driver.Stream) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuStreamSynchronize", true); r != driver.Success {
		return r
	}
	if _, ok := s.streams[h]; !ok && h != 0 {
		return driver.ErrInvalidHandle
	}
	s.finish(h)
	return driver.Success
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

// eventRecord is cuEventRecord: the event completes when the work enqueued on
// the stream so far has run: at once, or in manual mode when the test says.
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
	e.stream, e.recorded, e.done = st, true, !s.cfg.ManualEvents
	return driver.Success
}

// eventQuery is cuEventQuery: CUDA_ERROR_NOT_READY while pending; an event
// never recorded counts as complete, as on the driver.
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
	if e.recorded && !e.done {
		return driver.ErrNotReady
	}
	return driver.Success
}

// eventSynchronize is cuEventSynchronize: it blocks the calling thread until
// the event completes.
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
		if !e.recorded || e.done {
			return driver.Success
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
