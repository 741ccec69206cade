package governor

import "github.com/memgen/memgen/generated/memapi"

// Op names a point of the ledger where the governor consults its Injector
// (Options.Injector) before it changes anything.
type Op uint8

// The points an Injector is consulted at.
const (
	OpReserve           Op = iota + 1 // Governor.Reserve
	OpDraw                            // Grant.Draw
	OpUndraw                          // Grant.Undraw and Grant.Refund
	OpCommit                          // Grant.Commit
	OpCancel                          // Grant.Cancel
	OpRefund                          // Lease.Refund
	OpMarkPending                     // Lease.MarkPending
	OpQuarantine                      // Lease.Quarantine
	OpRefundQuarantined               // Lease.RefundQuarantined (and the account of Lease.QuarantinedAccount)
)

var opNames = [...]string{"", "reserve", "draw", "undraw", "commit", "cancel", "refund", "mark-pending", "quarantine", "refund-quarantined"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op?"
}

// Injector injects faults into the real ledger, for tests of what sits
// above it (a manager's rollbacks, a holder's retries): at each named
// point, before the operation changes anything, the governor asks it, and
// an operation it answers with an error fails with that error, changing
// nothing, as if the ledger had refused. It sees the authority and the
// bytes of the operation (0 for Commit and Cancel). MaybeError is called
// without the governor's locks, from any goroutine, so it must be safe
// for concurrent use; it may block or record the order of operations.
//
// A governor without one (the default) consults nothing: the check is one
// nil comparison.
type Injector interface {
	MaybeError(op Op, authority memapi.AuthorityID, bytes memapi.Bytes) error
}
