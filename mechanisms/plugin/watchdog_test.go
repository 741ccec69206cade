package plugin

import (
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"golang.org/x/sys/unix"
)

// TestWatchdogReportsStuckCall: a slot still running the watchdog's bound
// after it began is reported with the plugin and the slot's C name; a call
// that returns in time is not.
func TestWatchdogReportsStuckCall(t *testing.T) {
	stuck := make(chan Stuck, 4)
	w, err := NewWatchdog(50*time.Millisecond, func(s Stuck) { stuck <- s })
	if err != nil {
		t.Fatal(err)
	}
	m, _ := newSubjectOpts(t, build(t, "broken", "BROKEN_SLOW_MS=300"), Options{Watchdog: w, SlotTimeout: time.Hour})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-stuck:
		if s.Plugin != "broken" || s.Slot != "allocate" || s.Bound != 50*time.Millisecond || !strings.Contains(s.String(), "slot allocate did not return within 50ms") {
			t.Errorf("the watchdog reported %+v (%s), want allocate of plugin broken past 50ms", s, s)
		}
	default:
		t.Fatal("a 300 ms allocate under a 50 ms watchdog was not reported")
	}
	if len(stuck) != 0 {
		t.Errorf("%d more reports, want only the allocate's", len(stuck))
	}
	if _, err := NewWatchdog(0, func(Stuck) {}); err == nil {
		t.Error("NewWatchdog with a bound of 0 succeeded")
	}
}

// TestGuardPages: with Options.GuardPages every out struct and every copy's
// buffer is a guarded copy; the reference plugin, which writes nothing past
// them, passes the whole suite with them, bare and checked.
func TestGuardPages(t *testing.T) {
	r := recordSuite(t, refhost(t), Options{GuardPages: true, Verify: true}, true)
	if f := r.Failed(); len(f) > 0 {
		t.Fatalf("with guard pages the suite fails %v:\n%s", f, r.Report())
	}
	b := recordSuite(t, refhost(t), Options{GuardPages: true}, false)
	if f := b.Failed(); len(f) > 0 {
		t.Fatalf("with guard pages, bare, the suite fails %v:\n%s", f, b.Report())
	}
	g, err := newGuardBuf(24)
	if err != nil {
		t.Fatal(err)
	}
	defer g.free()
	if end := uintptr(g.ptr()) + 24; end%uintptr(unix.Getpagesize()) != 0 {
		t.Errorf("a 24-byte guarded buffer ends at %#x, not at a page boundary", end)
	}
}
