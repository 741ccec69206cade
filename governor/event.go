package governor

import (
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventPressure: a reservation did not fit and the queue lacks bytes
	// beyond free, pending and asks in flight (Bytes = that shortfall).
	EventPressure EventKind = iota + 1
	// EventTicket: a ticket is about to be handed to a holder's Reclaim.
	EventTicket
	// EventReclaimed: a holder's Reclaim returned (Bytes = freed, Err).
	EventReclaimed
	// EventWaiting: a reservation is waiting for refunds (Bytes = wanted).
	EventWaiting
	// EventServed: a waiting reservation was granted (Bytes = wanted).
	EventServed
	// EventOverBudget: a reservation failed (Err is the *OverBudgetError).
	EventOverBudget
	// EventGrantExpired: a grant passed its deadline and was reclaimed
	// (Bytes = undrawn bytes returned, Drawn = drawn bytes left reserved).
	EventGrantExpired
	// EventCapacity: an authority was added or its capacity changed (Bytes = capacity).
	EventCapacity
)

func (k EventKind) String() string {
	switch k {
	case EventPressure:
		return "Pressure"
	case EventTicket:
		return "Ticket"
	case EventReclaimed:
		return "Reclaimed"
	case EventWaiting:
		return "Waiting"
	case EventServed:
		return "Served"
	case EventOverBudget:
		return "OverBudget"
	case EventGrantExpired:
		return "GrantExpired"
	case EventCapacity:
		return "Capacity"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one thing the governor did, handed to Options.OnEvent. The hook
// is called synchronously, never while the governor holds a lock, from the
// goroutine that caused the event (a reserving caller, a timer); it may call
// the governor but should return quickly.
type Event struct {
	Kind      EventKind
	Time      time.Time
	Authority memapi.AuthorityID
	Holder    HolderID // the requester (Pressure, Waiting, Served, OverBudget), the asked holder (Ticket, Reclaimed), the grant's holder (GrantExpired)
	Role      Role
	Bytes     memapi.Bytes
	Drawn     memapi.Bytes // GrantExpired only
	Ticket    Ticket       // Ticket and Reclaimed only
	Err       error
}
