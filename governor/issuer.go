package governor

import "github.com/memgen/memgen/generated/memapi"

// The governor is a checked.Ledger: a checked wrapper built with it accepts
// only the grants and leases this governor issued. A grant of another
// governor, a zero Grant never reserved, or a hand-made value with a Grant's
// methods is refused (memapi.ErrForeignGrant) before anything is drawn.
// Recognition is by concrete type and the link every issued grant keeps to
// its governor (through its authority), which no code outside the package
// can set.

// IssuedGrant reports whether g is a Grant this governor reserved.
func (g *Governor) IssuedGrant(x memapi.Grant) bool {
	gr, ok := x.(Grant)
	return ok && g.issued(gr.g)
}

// IssuedAccount reports whether a is a Grant or a Lease of this governor,
// or one of the accounts it issues over them (Lease.QuarantinedAccount,
// Split) whose every account is its own.
func (g *Governor) IssuedAccount(x memapi.Account) bool {
	switch v := x.(type) {
	case Grant:
		return g.issued(v.g)
	case Lease:
		return g.issued(v.g)
	case quarantinedAccount:
		return g.issued(v.l.g)
	case *splitAccount:
		if v == nil || v.g != g {
			return false
		}
		if _, ok := v.foreignPart(); !ok {
			return false
		}
		for _, p := range v.parts {
			if !g.IssuedAccount(p.Account) {
				return false
			}
		}
		return true
	}
	return false
}

// issued reports whether gr was issued by g.
func (g *Governor) issued(gr *grant) bool {
	return gr != nil && gr.a.g == g
}
