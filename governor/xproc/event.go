package xproc

import (
	"fmt"
	"time"
)

// eventKind says what an event reports.
type eventKind uint8

const (
	// eventReclaimed: the slot of a dead process was freed and its claim
	// returned to the shared capacity.
	eventReclaimed eventKind = iota + 1
	// eventLimits: the shared capacity changed (Revision says to what).
	eventLimits
)

func (k eventKind) String() string {
	switch k {
	case eventReclaimed:
		return "reclaimed"
	case eventLimits:
		return "limits"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// event is something the watcher saw happen to the shared ledger.
type event struct {
	Kind     eventKind
	Time     time.Time
	Slot     int
	PID      int    // the dead process (eventReclaimed)
	Claim    uint64 // what its slot held when reclaimed
	Reserved uint64
	Charged  uint64
	Pending  uint64
	Private  uint64
	Want     uint64 // its want, withdrawn with the slot
	Revision uint64 // the limits' revision (eventLimits)
	Capacity uint64
}
