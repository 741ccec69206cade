package governor

import "github.com/memgen/memgen/generated/memapi"

// Injector injects faults into the real ledger, for tests of what sits
// above it (a manager's rollbacks, a holder's retries): at each operation,
// before it changes anything, the governor asks it, and an operation it
// answers with an error fails with that error, changing nothing, as if the
// ledger had refused.
//
// op names the operation as its errors do (memapi.Error.Op):
// "governor.Reserve", "governor.Grant.Draw", "governor.Grant.Undraw",
// "governor.Grant.Refund", "governor.Grant.Commit", "governor.Grant.Cancel",
// "governor.Lease.Refund", "governor.Lease.MarkPending",
// "governor.Lease.Quarantine" and "governor.Lease.RefundQuarantined" (which
// the account of Lease.QuarantinedAccount calls). The injector sees the authority and the bytes
// of the operation (0 for Commit and Cancel). MaybeError is called without
// the governor's locks, from any goroutine, so it must be safe for
// concurrent use; it may block or record the order of operations.
//
// A governor without one (the default) consults nothing: the check is one
// nil comparison.
type Injector interface {
	MaybeError(op string, authority memapi.AuthorityID, bytes memapi.Bytes) error
}
