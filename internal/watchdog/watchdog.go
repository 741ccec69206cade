// Package watchdog bounds the waits of tests: a test that waits on a
// queue, a hold, a lock or a transaction runs the wait through Within, so
// that a deadlock or a lost wake-up fails the test at once with every
// goroutine's stack, instead of hanging the suite until go test's timeout.
// It times nothing: the bound is minutes, far above any wait that can
// succeed on a loaded 2-core machine under the race detector, and a failure
// says "watchdog" so that no reader takes it for a slow operation.
package watchdog

import (
	"runtime"
	"time"
)

// T is what Within needs of a test: a *testing.T or *testing.B, or a
// *rapid.T in a property test.
type T interface {
	Helper()
	Errorf(format string, args ...any)
	FailNow()
}

// Bound is the bound the packages' tests give a wait that must end: far
// above any that succeeds on a loaded machine, far below go test's timeout
// (10 minutes).
const Bound = 2 * time.Minute

// Within runs f in its own goroutine and waits for it to return; if it has
// not after d, the test fails now, naming what and printing every
// goroutine's stack (the goroutine blocked in f among them). f's goroutine
// is left behind then: the test binary is failing anyway.
func Within(t T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		t.Errorf("watchdog: %s did not return within %v; goroutines:\n%s", what, d, buf)
		t.FailNow()
	}
}

// Recv receives from ch within d (Within), failing the test as Within does
// when nothing came; what names the wait.
func Recv[V any](t T, d time.Duration, what string, ch <-chan V) V {
	t.Helper()
	var v V
	Within(t, d, what, func() { v = <-ch })
	return v
}
