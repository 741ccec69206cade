package pmm

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// GovernorLedger adapts a governor to the manager's Ledger: reservations
// carry the binding's holder, role and priority; grants and leases are the
// governor's own.
func GovernorLedger(g *governor.Governor) Ledger { return govLedger{g} }

type govLedger struct{ g *governor.Governor }

func (l govLedger) Reserve(ctx context.Context, r Request) (Grant, error) {
	gr, err := l.g.Reserve(ctx, r.Authority, governor.HolderID(r.Holder), governor.Role(r.Role), r.Bytes, governor.Priority(r.Priority), r.Deadline)
	if err != nil {
		return nil, err
	}
	return govGrant{gr}, nil
}

type govGrant struct{ *governor.Grant }

func (g govGrant) Commit() (Lease, error) {
	l, err := g.Grant.Commit()
	if err != nil {
		return nil, err
	}
	return l, nil
}

// IssuedGrant reports whether g is a grant of this governor as the manager
// passes it (checked.Ledger).
func (l govLedger) IssuedGrant(g memapi.Grant) bool {
	gg, ok := g.(govGrant)
	return ok && l.g.IssuedGrant(gg.Grant)
}

// IssuedAccount reports whether a is a grant or a lease of this governor as
// the manager passes them (checked.Ledger).
func (l govLedger) IssuedAccount(a memapi.Account) bool {
	if gg, ok := a.(govGrant); ok {
		return l.g.IssuedAccount(gg.Grant)
	}
	return l.g.IssuedAccount(a)
}
