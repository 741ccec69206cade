package main

import (
	"sync"
	"time"
)

// simClock is the simulation's time: the governor, the residency stores
// and the report all read it, and only the run loop moves it. It is a
// governor.Clock: timers fire (each in its own goroutine, as the interface
// asks) when Advance passes their time; Close waits for those goroutines.
type simClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*simTimer
	wg     sync.WaitGroup
}

type simTimer struct {
	c       *simClock
	at      time.Time
	f       func()
	stopped bool
}

func newSimClock(start time.Time) *simClock { return &simClock{now: start} }

// Now returns the simulated time.
func (c *simClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d in simulated time.
func (c *simClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &simTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t.Stop
}

// Stop cancels the timer if it has not fired.
func (t *simTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.stopped {
		return false
	}
	t.stopped = true
	return true
}

// Advance moves simulated time forward by d and fires the timers now due.
func (c *simClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	keep := c.timers[:0]
	var due []func()
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t.f)
		default:
			keep = append(keep, t)
		}
	}
	clear(c.timers[len(keep):])
	c.timers = keep
	c.wg.Add(len(due))
	c.mu.Unlock()
	for _, f := range due {
		go func() {
			defer c.wg.Done()
			f()
		}()
	}
}

// Close waits for the timer goroutines that are running.
func (c *simClock) Close() { c.wg.Wait() }
