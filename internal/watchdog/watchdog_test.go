package watchdog

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeT records what Within reports.
type fakeT struct {
	msgs   []string
	failed bool
}

func (f *fakeT) Helper() {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
}
func (f *fakeT) FailNow() { f.failed = true }

func TestWithinReturns(t *testing.T) {
	var ft fakeT
	ran := false
	Within(&ft, time.Minute, "f", func() { ran = true })
	if !ran || ft.failed || len(ft.msgs) != 0 {
		t.Fatalf("ran %v, failed %v, %q", ran, ft.failed, ft.msgs)
	}
}

// blockedHere is a name that shows in the stack of the blocked goroutine.
func blockedHere(ch chan struct{}) { <-ch }

func TestWithinFailsWithStacks(t *testing.T) {
	var ft fakeT
	release := make(chan struct{})
	defer close(release)
	Within(&ft, 10*time.Millisecond, "the wait", func() { blockedHere(release) })
	if !ft.failed || len(ft.msgs) != 1 {
		t.Fatalf("failed %v, %d messages", ft.failed, len(ft.msgs))
	}
	if m := ft.msgs[0]; !strings.Contains(m, "watchdog: the wait did not return within 10ms") || !strings.Contains(m, "watchdog.blockedHere") {
		t.Fatalf("message lacks the wait or the blocked goroutine's stack:\n%s", m)
	}
}
