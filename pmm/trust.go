package pmm

import (
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// trustOf returns the checked.Ledger the manager's own wrappers are built
// with. When the ledger vouches for its grants and leases (GovernorLedger
// does), the wrapper checks every grant's issuer: the ledger's grants and
// leases, and the manager's own accounts over them (a decommit's
// splitAccount, whose every part refunds to such a lease; quarantined, a
// retry's refund of such a lease's quarantined bytes; and zeroAccount, which
// refunds nothing). A Ledger that cannot vouch is trusted for what
// reaches those wrappers, which is only what the manager passes. The wrapper
// Mechanism hands out trusts nothing either way.
func trustOf(l Ledger) checked.Ledger {
	if t, ok := l.(checked.Ledger); ok {
		return managerTrust{t}
	}
	return ownCalls{}
}

// managerTrust is a vouching ledger plus the manager's own accounts.
type managerTrust struct{ ledger checked.Ledger }

func (t managerTrust) IssuedGrant(g memapi.Grant) bool { return t.ledger.IssuedGrant(g) }

func (t managerTrust) IssuedAccount(a memapi.Account) bool {
	switch v := a.(type) {
	case splitAccount:
		for _, p := range v.parts {
			if !t.ledger.IssuedAccount(p.lease) {
				return false
			}
		}
		return true
	case quarantined:
		return t.ledger.IssuedAccount(v.l)
	case zeroAccount:
		return true
	}
	return t.ledger.IssuedAccount(a)
}

// ownCalls vouches for every grant and account: the trust of a manager
// whose ledger cannot vouch, for wrappers no caller outside the manager
// reaches.
type ownCalls struct{}

func (ownCalls) IssuedGrant(memapi.Grant) bool     { return true }
func (ownCalls) IssuedAccount(memapi.Account) bool { return true }
