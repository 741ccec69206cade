package xproc

import (
	"fmt"
	"time"
)

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventReclaimed: the slot of a dead process was freed and its claim
	// returned to the shared capacity.
	EventReclaimed EventKind = iota + 1
	// EventLimits: the shared capacity changed (Revision says to what).
	EventLimits
)

func (k EventKind) String() string {
	switch k {
	case EventReclaimed:
		return "reclaimed"
	case EventLimits:
		return "limits"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is something the watcher saw happen to the shared ledger.
type Event struct {
	Kind     EventKind
	Time     time.Time
	Slot     int
	PID      int    // the dead process (EventReclaimed)
	Claim    uint64 // what its slot held when reclaimed
	Reserved uint64
	Charged  uint64
	Pending  uint64
	Private  uint64
	Want     uint64 // its want, withdrawn with the slot
	Revision uint64 // the limits' revision (EventLimits)
	Capacity uint64
}
