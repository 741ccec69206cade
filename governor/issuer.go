package governor

import "github.com/memgen/memgen/generated/memapi"

// The governor is a checked.Ledger: a checked wrapper built with it accepts
// only the grants and leases this governor issued. A grant of another
// governor, a zero Grant never reserved, or a hand-made value with a Grant's
// methods is refused (memapi.ErrForeignGrant) before anything is drawn.
// Recognition is by concrete type and the link every issued grant keeps to
// its governor (through its authority), which no code outside the package
// can set. A copy of an issued grant or lease is not vouched for.

// IssuedGrant reports whether g is a Grant this governor reserved.
func (g *Governor) IssuedGrant(x memapi.Grant) bool {
	gr, ok := x.(*Grant)
	return ok && g.issued(gr)
}

// IssuedAccount reports whether a is a Grant or a Lease of this governor.
func (g *Governor) IssuedAccount(x memapi.Account) bool {
	switch v := x.(type) {
	case *Grant:
		return g.issued(v)
	case *Lease:
		return v != nil && g.issued(v.g) && &v.g.lease == v // not a copy of the lease
	}
	return false
}

// issued reports whether gr was issued by g at least once, and is that
// grant, not a copy of it (Grant.copied).
func (g *Governor) issued(gr *Grant) bool {
	return gr != nil && gr.acct != nil && !gr.copied() && gr.acct.a.g == g
}
