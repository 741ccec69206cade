package pmm

import (
	"context"

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
