package pmm

import (
	"context"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// GovernorLedger adapts a governor to the manager's Ledger: reservations
// carry the binding's holder, role and priority; grants and leases are the
// governor's own. A Binding's Allocate takes the governor's allocation-free
// path (governor.Binding.ReserveInto) into grants it reuses once their
// buffer was freed and refunded (see grantPool).
func GovernorLedger(g *governor.Governor) Ledger { return govLedger{g} }

type govLedger struct{ g *governor.Governor }

// HasAuthority reports whether the governor has authority id now
// (AuthorityLedger).
func (l govLedger) HasAuthority(id memapi.AuthorityID) bool {
	_, ok := l.g.Authority(id)
	return ok
}

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

// grantPool is a binding's reservation path on the governor for one
// authority, and the grants whose use ended (cancelled, or committed and
// refunded whole), which ReserveInto fills again without allocating.
type grantPool struct {
	mu   sync.Mutex
	gb   *governor.Binding
	free []*governor.Grant
}

// reserveReusable reserves n bytes like reserve, in a grant from the pool
// when the ledger is the governor's: put it back with putGrant once its use
// ended. It reports the grant to put back (nil for another ledger).
func (b *Binding) reserveReusable(ctx context.Context, d *device, n memapi.Bytes) (Grant, *governor.Grant, error) {
	gl, ok := b.m.ledger.(govLedger)
	if !ok {
		g, err := b.reserve(ctx, d, n)
		return g, nil, err
	}
	p := &b.pool
	p.mu.Lock()
	if p.gb == nil || p.gb.Authority() != d.authority {
		gb, err := gl.g.Bind(d.authority, governor.HolderID(b.holder), governor.Role(b.role))
		if err != nil {
			p.mu.Unlock()
			return nil, nil, err
		}
		p.gb = gb
	}
	gb := p.gb
	var gr *governor.Grant
	if k := len(p.free); k > 0 {
		gr, p.free = p.free[k-1], p.free[:k-1]
	} else {
		gr = new(governor.Grant)
	}
	p.mu.Unlock()
	if err := gb.ReserveInto(ctx, gr, n, governor.Priority(b.priority), time.Time{}); err != nil {
		b.putGrant(gr) // a failed ReserveInto leaves it reusable
		return nil, nil, err
	}
	return govGrant{gr}, gr, nil
}

// putGrant returns a grant whose use ended to the pool.
func (b *Binding) putGrant(gr *governor.Grant) {
	if gr == nil {
		return
	}
	p := &b.pool
	p.mu.Lock()
	if len(p.free) < 64 {
		p.free = append(p.free, gr)
	}
	p.mu.Unlock()
}
