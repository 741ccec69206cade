package governor

import "time"

// Clock is the governor's source of time: deadlines of grants and waits are
// measured and scheduled with it. Tests inject a fake one so nothing sleeps.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed. It must
	// never call f before returning (the governor may hold a lock). stop
	// prevents the call if it has not started and reports whether it did
	// (time.AfterFunc(d, f).Stop).
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// wallClock returns the wall clock (time.Now and time.AfterFunc).
func wallClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}
