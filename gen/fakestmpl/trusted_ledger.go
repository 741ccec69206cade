//go:build memgentmpl

package fakes

import memapi "github.com/memgen/memgen/generated/memapi"

// Ledger vouches for every fake Grant and Account, and for nothing else: it
// is the ledger a checked wrapper is built with when fake grants are drawn
// from, as in checked.Wrap(m, fakes.Ledger). It recognises the fakes by
// their type, so a grant of another kind (a hand-made struct with the same
// methods, or another ledger's grant) is rejected with ErrForeignGrant.
var Ledger = fakeLedger{}

// fakeLedger is the type of Ledger.
type fakeLedger struct{}

// IssuedGrant reports whether g is a fake Grant, and its authority.
func (fakeLedger) IssuedGrant(g memapi.Grant) (memapi.AuthorityID, bool) {
	if x, ok := g.(*Grant); ok {
		return x.Authority(), true
	}
	return "", false
}

// IssuedAccount reports whether a is a fake Account or Grant (a grant is
// also the account its own rollbacks refund to), and its authority.
func (fakeLedger) IssuedAccount(a memapi.Account) (memapi.AuthorityID, bool) {
	switch a.(type) {
	case *Account, *Grant:
		return a.Authority(), true
	}
	return "", false
}
