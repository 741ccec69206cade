package llamacpp

import (
	"context"
	"fmt"
	"time"
)

// idle waits, while no request runs, for the next admitted one. With
// ServerOptions.SleepAfter set, the model goes to sleep once it has been
// idle that long, and the next request wakes it before it decodes; a wake
// that fails fails that request (the model stays asleep, its bytes in the
// host tier or, at level 2, to be reloaded from the model file, and the
// next request tries again). It returns false when the server closes.
func (s *Server) idle() (*job, bool) {
	var timer <-chan time.Time
	if s.opts.SleepAfter > 0 && !s.m.Asleep() {
		t := time.NewTimer(s.opts.SleepAfter)
		defer t.Stop()
		timer = t.C
	}
	for {
		select {
		case j := <-s.jobs:
			if s.m.Asleep() {
				if err := s.wake(); err != nil {
					s.finish(j, event{end: true, err: err})
					continue
				}
			}
			return j, true
		case <-s.ctx.Done():
			return nil, false
		case <-timer:
			timer = nil
			s.sleep()
		}
	}
}

// sleep puts the idle model to sleep at SleepLevel, bounded by
// StepTimeout.
func (s *Server) sleep() {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.StepTimeout)
	defer cancel()
	err := s.m.SleepLevel(ctx, s.opts.SleepLevel, s.opts.SleepTo)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.stats.SleepErrors++
		return
	}
	s.stats.Sleeps++
	s.stats.Asleep = true
}

// wake wakes the model for a request, bounded by StepTimeout.
func (s *Server) wake() error {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.StepTimeout)
	defer cancel()
	start := time.Now()
	err := s.m.Wake(ctx)
	took := time.Since(start)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.WakeTime += took
	if err != nil {
		return fmt.Errorf("llamacpp: waking the model: %w", err)
	}
	s.stats.Wakes++
	s.stats.Asleep = false
	return nil
}
