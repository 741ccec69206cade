package pmm

import (
	"context"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Ledger is what the manager needs from the governor: provisional grants.
// governor.Governor satisfies it through GovernorLedger.
type Ledger interface {
	Reserve(ctx context.Context, r Request) (Grant, error)
}

// AuthorityLedger is a Ledger that knows its authorities. Register and
// Bind refuse a device whose authority it does not have, with an error of
// kind governor.ErrUnknownAuthority, instead of letting the first
// reservation fail. GovernorLedger's ledger is one.
type AuthorityLedger interface {
	Ledger
	HasAuthority(id memapi.AuthorityID) bool
}

// Request asks the ledger for a provisional grant.
type Request struct {
	Authority memapi.AuthorityID
	Holder    string
	Role      string
	Bytes     memapi.Bytes
	Priority  int
	Deadline  time.Time // zero: none
}

// Grant is a provisional grant: consuming calls draw from it; refunds to it
// un-draw (rollback); Commit turns the drawn bytes into a Lease and returns
// the rest; Cancel returns everything and fails while bytes are still drawn.
type Grant interface {
	memapi.Grant
	memapi.Account
	Commit() (Lease, error)
	Cancel() error
}

// Lease is a holder's charge. MarkPending moves bytes to pending-free when
// the memory waits for fences; Refund returns bytes really freed.
// Quarantine books bytes whose free (or rollback) failed as quarantined,
// charged and visible, and RefundQuarantined returns them once a retry
// freed them.
type Lease interface {
	memapi.Account
	MarkPending(n memapi.Bytes) error
	Quarantine(n memapi.Bytes) error
	RefundQuarantined(n memapi.Bytes) error
}

// quarantined is the account a retry refunds: the lease's quarantined bytes.
//
//memvet:allow it issues nothing: it forwards a retry's refund to the governor lease whose bytes were quarantined
type quarantined struct{ l Lease }

func (q quarantined) Authority() memapi.AuthorityID { return q.l.Authority() }
func (q quarantined) Refund(n memapi.Bytes) error   { return q.l.RefundQuarantined(n) }
