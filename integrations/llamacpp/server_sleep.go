package llamacpp

import (
	"context"
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// idle waits, while no request runs, for the next admitted one. With
// ServerOptions.SleepAfter set, the model goes to sleep once it has been
// idle that long; with SleepOnPressure, when a pressure ticket asks its
// weights for memory. The next request wakes it before it decodes; a wake
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
	if idleCall != nil {
		idleCall()
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
			ctx, cancel := context.WithTimeout(s.ctx, s.opts.StepTimeout)
			_, _ = s.sleep(ctx, false)
			cancel()
		case ask := <-s.asks:
			freed, err := s.sleepForTicket(ask.ctx)
			ask.reply <- pressureAnswer{freed, err}
			if s.m.Asleep() {
				timer = nil
			}
		}
	}
}

// idleCall, set by tests, is called each time the loop begins to wait
// idle for a request: a ticket that comes after it is the idle loop's.
var idleCall func()

// pressureAsk is a pressure ticket to the weights' holder, handed to the
// loop (ServerOptions.SleepOnPressure); the loop answers on reply.
type pressureAsk struct {
	ctx   context.Context
	reply chan pressureAnswer // buffered: the loop never waits on it
}

type pressureAnswer struct {
	freed memapi.Bytes
	err   error
}

// onPressure is the weights' holder's answer to a ticket (Model's
// onPressure, ServerOptions.SleepOnPressure). The loop answers it while
// it waits idle for a request (idle). A ticket that comes while a request
// is admitted (running, or waiting for the loop) is answered at once with
// nothing and counted (PressureBusy), except while a sleep is under way
// (its bytes are on their way back). A ticket that comes when no request
// is admitted waits for the loop, which may still be finishing the last
// request's step (the request ended for its client when its sequence was
// released): the loop takes it once it waits idle; should a request be
// admitted meanwhile, the loop answers it with nothing at its next step.
// A sleep, once begun, is not abandoned when the ticket's reservation
// stops waiting (on a shared ledger a want's answer waits one xproc Poll,
// 100 ms unless set, less than moving a large model takes): the answer
// then is 0 and the sleep goes on in the loop, bounded by StepTimeout; the
// bytes it gives back are free once it ends, for the next reservation (on
// a ledger, trimmed back to it, where the wanting process claims them).
func (s *Server) onPressure(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
	if t.Authority != s.c.authority() {
		return 0, nil
	}
	s.mu.Lock()
	admitted := len(s.free) < s.opts.Sequences
	s.mu.Unlock()
	if admitted {
		return s.busy(), nil
	}
	ask := pressureAsk{ctx: ctx, reply: make(chan pressureAnswer, 1)}
	select {
	case s.asks <- ask:
	default: // another ticket waits for the loop
		return s.busy(), nil
	}
	select {
	case a := <-ask.reply:
		return a.freed, a.err
	case <-ctx.Done():
		return 0, nil
	case <-s.ctx.Done(): // the server closed: its loop answers no more
		return 0, nil
	}
}

// busy counts a ticket answered with nothing (ServerStats.PressureBusy):
// a request runs or waits to run, or another ticket already waits for the
// loop; a ticket that arrives while a sleep is under way is not counted.
// It returns the bytes given: none.
func (s *Server) busy() memapi.Bytes {
	if !s.sleeping.Load() {
		s.mu.Lock()
		s.stats.PressureBusy++
		s.mu.Unlock()
	}
	return 0
}

// sleepForTicket puts the idle model to sleep for a pressure ticket whose
// reservation's context is ctx, unless a request was admitted meanwhile
// or the reservation stopped waiting; it returns the device bytes the
// sleep gave back. Once begun the sleep is bounded by StepTimeout and the
// server's life, not by ctx.
func (s *Server) sleepForTicket(ctx context.Context) (memapi.Bytes, error) {
	if len(s.jobs) > 0 {
		return s.busy(), nil
	}
	if s.m.Asleep() || ctx.Err() != nil {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.StepTimeout)
	defer cancel()
	return s.sleep(ctx, true)
}

// sleep puts the idle model to sleep at SleepLevel into SleepTo, bounded
// by ctx, and returns the device bytes it gave back (the weights' and the
// KV cache's).
func (s *Server) sleep(ctx context.Context, ticket bool) (memapi.Bytes, error) {
	s.sleeping.Store(true)
	defer s.sleeping.Store(false)
	freed, err := s.m.sleep(ctx, "llamacpp.Server", s.opts.SleepLevel, s.opts.SleepTo)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.stats.SleepErrors++
		return freed, err
	}
	s.stats.Sleeps++
	s.stats.Asleep = true
	if ticket {
		s.stats.PressureSleeps++
		s.stats.PressureFreed += freed
	}
	return freed, nil
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
