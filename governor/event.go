package governor

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// The kinds of Event (Event.Kind): what it reports, by name.
const (
	// EventPressure: a reservation did not fit and the queue lacks bytes
	// beyond free, pending and asks in flight (Bytes = that shortfall).
	EventPressure = "pressure"
	// EventTicket: a ticket is about to be handed to a holder's Reclaim.
	EventTicket = "ticket"
	// EventReclaimed: a holder's Reclaim returned (Bytes = freed, Err).
	EventReclaimed = "reclaimed"
	// EventWaiting: a reservation is waiting for refunds (Bytes = wanted).
	EventWaiting = "waiting"
	// EventServed: a waiting reservation was granted (Bytes = wanted).
	EventServed = "served"
	// EventOverBudget: a reservation failed (Err is the *OverBudgetError).
	EventOverBudget = "over_budget"
	// EventGrantExpired: a grant passed its deadline and was reclaimed
	// (Bytes = undrawn bytes returned, Drawn = drawn bytes left reserved).
	EventGrantExpired = "grant_expired"
	// EventCapacity: an authority was added or its capacity changed (Bytes = capacity).
	EventCapacity = "capacity"
)

// Event is one thing the governor did, handed to Options.OnEvent. The hook
// is called synchronously, never while the governor holds a lock, from the
// goroutine that caused the event (a reserving caller, a timer); it may call
// the governor but should return quickly.
type Event struct {
	Kind      string // one of the Event kinds above (EventPressure, ...)
	Time      time.Time
	Authority memapi.AuthorityID
	Holder    HolderID // the requester (Pressure, Waiting, Served, OverBudget), the asked holder (Ticket, Reclaimed), the grant's holder (GrantExpired)
	Role      string
	Bytes     memapi.Bytes
	Drawn     memapi.Bytes // GrantExpired only
	Ticket    Ticket       // Ticket and Reclaimed only
	Err       error
}
