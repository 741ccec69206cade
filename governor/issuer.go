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

// IssuedAccount reports whether a is a Grant or a Lease of this governor,
// or one of the accounts it issues over them (Lease.QuarantinedAccount,
// Split, ZeroAccount) whose every account is its own.
func (g *Governor) IssuedAccount(x memapi.Account) bool {
	switch v := x.(type) {
	case *Grant:
		return g.issued(v)
	case *Lease:
		return g.issuedLease(v)
	case quarantinedAccount:
		return g.issuedLease(v.l)
	case *splitAccount:
		if v == nil || v.g != g {
			return false
		}
		for _, p := range v.parts {
			if !g.IssuedAccount(p.Account) {
				return false
			}
		}
		return true
	case *zeroAccount:
		return v != nil && v.g == g
	}
	return false
}

// issuedLease reports whether l is the lease of a grant of g, not a copy.
func (g *Governor) issuedLease(l *Lease) bool {
	return l != nil && g.issued(l.g) && &l.g.lease == l
}

// issued reports whether gr was issued by g at least once, and is that
// grant, not a copy of it (Grant.copied).
func (g *Governor) issued(gr *Grant) bool {
	return gr != nil && gr.acct != nil && !gr.copied() && gr.acct.a.g == g
}
