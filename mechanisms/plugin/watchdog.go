package plugin

import (
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Watchdog bounds every call into a plugin's C code (Options.Watchdog): a
// call still running its bound after it began is reported to the expired
// function, on a goroutine of its own. A C call cannot be preempted, so the
// report is all the host can do about it; a host that runs the plugin in a
// process of its own (memgen plugin-check) reports the call and ends the
// process there. In production a plugin checks deadline_ns itself and no
// watchdog is set: a nil Watchdog costs a call nothing.
type Watchdog struct {
	bound   time.Duration
	expired func(Stuck)
}

// Stuck is a call into a plugin that had not returned within its bound.
type Stuck struct {
	Plugin memapi.MechanismID
	Slot   string // the slot's C name, or what the host was doing (the entry point)
	Bound  time.Duration
}

func (s Stuck) String() string {
	return fmt.Sprintf("plugin %s: slot %s did not return within %v", s.Plugin, s.Slot, s.Bound)
}

// NewWatchdog returns a watchdog that calls expired for each call still
// running bound after it began. bound must be positive.
func NewWatchdog(bound time.Duration, expired func(Stuck)) (*Watchdog, error) {
	if bound <= 0 || expired == nil {
		return nil, fmt.Errorf("plugin.NewWatchdog: the bound must be positive and expired set (bound %v)", bound)
	}
	return &Watchdog{bound: bound, expired: expired}, nil
}

// Bound is the time a call may take.
func (w *Watchdog) Bound() time.Duration { return w.bound }

// Watch bounds one call the host makes into a plugin outside a Mechanism
// (the library's loading and entry point, which Open runs): the bound ends
// when the returned timer is stopped.
func (w *Watchdog) Watch(plugin memapi.MechanismID, what string) *time.Timer {
	s := Stuck{Plugin: plugin, Slot: what, Bound: w.bound}
	return time.AfterFunc(w.bound, func() { w.expired(s) })
}

// begin bounds a call of slot fn of l.
func (w *Watchdog) begin(l *Library, fn uintptr) *time.Timer {
	return w.Watch(l.Name, l.slotName(fn))
}
