package governor

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
)

// ErrUnknown is what a call that names an authority or a holder the
// governor does not know fails with (errors.Is matches it): the authority
// was never added or was removed, or the holder is not registered; the
// error says which.
var ErrUnknown = errors.New("governor: unknown authority or holder")

// The governor's failure kinds. They appear as the Kind of a *memapi.Error
// (or of an *OverBudgetError), and each wraps the exported error a caller
// matches with errors.Is.
var (
	// errUnknownAuthority: the authority was never added or was removed.
	errUnknownAuthority = fmt.Errorf("governor: unknown authority: %w", ErrUnknown)
	// errUnknownHolder: the holder is not registered.
	errUnknownHolder = fmt.Errorf("governor: unknown holder: %w", ErrUnknown)
	// errDuplicate: an authority or holder with that id already exists
	// (memapi.ErrInUse).
	errDuplicate = fmt.Errorf("governor: duplicate: %w", memapi.ErrInUse)
	// errOverReturn: more bytes were undrawn, refunded or marked pending
	// than the grant or lease holds (memapi.ErrInvalidSize).
	errOverReturn = fmt.Errorf("governor: returned more than was taken: %w", memapi.ErrInvalidSize)
	// errDefaultWait is the cause (OverBudgetError.Err) of a reservation
	// with no deadline, neither its own nor its ctx's, that was not served
	// within the governor's Options.DefaultWait (context.DeadlineExceeded:
	// a caller whose ctx had no deadline knows it was this wait).
	errDefaultWait = fmt.Errorf("governor: reservation with no deadline not served within Options.DefaultWait: %w", context.DeadlineExceeded)
	// errOverLimit: the reservation would take the holder past its limit
	// on the authority (memapi.ErrOverBudget; OverBudgetError.Limit is
	// set).
	errOverLimit = fmt.Errorf("governor: over holder limit: %w", memapi.ErrOverBudget)
)

// OverBudgetError is the typed failure of Reserve: the authority could not
// grant the bytes (Kind memapi.ErrOverBudget), or the holder's limit forbids
// them (a Kind that matches memapi.ErrOverBudget too; Limit is set). It carries the figures at the moment of failure.
// It unwraps to a *memapi.Error (Op, Kind, Authority, Wanted, Available =
// Free, or the room left under the limit) and to the cause, so errors.Is
// matches memapi.ErrOverBudget, the Kind, and context.DeadlineExceeded or
// context.Canceled when the wait ended that way.
type OverBudgetError struct {
	Op        string
	Kind      error // memapi.ErrOverBudget or errOverLimit
	Authority memapi.AuthorityID
	Holder    HolderID
	Reason    string // a short explanation

	Wanted      memapi.Bytes // bytes asked for
	Free        memapi.Bytes // free bytes of the authority
	Reclaimable memapi.Bytes // charged bytes over their holders' guarantees, of holders that can reclaim
	Pending     memapi.Bytes // bytes waiting for fences before their free
	Reserved    memapi.Bytes
	Charged     memapi.Bytes
	Capacity    memapi.Bytes
	Waiting     memapi.Bytes // bytes of the reservations queued ahead of this one

	Limit     memapi.Bytes // the holder's limit (errOverLimit only)
	HolderUse memapi.Bytes // the holder's reserved+charged+pending+waiting (errOverLimit only)

	Tickets int          // tickets issued for this reservation
	Freed   memapi.Bytes // bytes the asked holders reported freeing

	Err error // the cause: the context's error, context.DeadlineExceeded for the reservation deadline, errDefaultWait for the governor's default wait, or nil

}

func (e *OverBudgetError) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	b.WriteString(": ")
	kind := e.Kind
	if kind == nil {
		kind = memapi.ErrOverBudget
	}
	b.WriteString(strings.TrimPrefix(strings.TrimPrefix(kind.Error(), "memapi: "), "governor: "))
	if e.Reason != "" {
		b.WriteString(": " + e.Reason)
	}
	if errors.Is(kind, errOverLimit) {
		fmt.Fprintf(&b, " (holder %s wanted %d, using %d, limit %d)", e.Holder, e.Wanted, e.HolderUse, e.Limit)
	} else {
		fmt.Fprintf(&b, " (holder %s wanted %d: free %d, reclaimable %d, pending %d, reserved %d, charged %d, capacity %d; %d tickets, %d freed)",
			e.Holder, e.Wanted, e.Free, e.Reclaimable, e.Pending, e.Reserved, e.Charged, e.Capacity, e.Tickets, e.Freed)
	}
	fmt.Fprintf(&b, " [authority %s]", e.Authority)
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the equivalent *memapi.Error and the cause.
func (e *OverBudgetError) Unwrap() []error {
	kind := e.Kind
	if kind == nil {
		kind = memapi.ErrOverBudget
	}
	avail := e.Free
	if errors.Is(kind, errOverLimit) {
		avail = 0
		if e.Limit > e.HolderUse {
			avail = e.Limit - e.HolderUse
		}
	}
	me := &memapi.Error{
		Op:        e.Op,
		Kind:      kind,
		Authority: e.Authority,
		Wanted:    e.Wanted,
		Available: avail,
		Detail:    e.Reason,
	}
	if e.Err == nil {
		return []error{me}
	}
	return []error{me, e.Err}
}

// opError returns a *memapi.Error for the governor's other failures.
func opError(op string, kind error, auth memapi.AuthorityID, wanted, avail memapi.Bytes, detail string) *memapi.Error {
	return &memapi.Error{Op: op, Kind: kind, Authority: auth, Wanted: wanted, Available: avail, Detail: detail}
}
