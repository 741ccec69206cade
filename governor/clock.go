package governor

import "time"

// Clock is the governor's source of time: deadlines of grants and waits are
// measured and scheduled with it. Tests inject a fake one so nothing sleeps.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed. It must
	// never call f before returning (the governor may hold a lock).
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled call made by Clock.AfterFunc.
type Timer interface {
	// Stop prevents the call if it has not started; it reports whether it did.
	Stop() bool
}

// wallClock returns the wall clock (time.Now and time.AfterFunc).
func wallClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
