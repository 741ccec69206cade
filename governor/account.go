package governor

import (
	"errors"

	"github.com/memgen/memgen/generated/memapi"
)

// Besides grants and leases, the governor issues the accounts a manager
// refunds to when one release covers several leases, when a retry frees
// bytes booked quarantined, or when a release should have nothing left to
// refund (a split of no parts). They are the governor's (IssuedAccount vouches for them when
// every account they forward to is its own), so a checked wrapper built
// with the governor accepts them and nothing else.

// QuarantinedAccount returns the account a retry refunds once it freed
// bytes of l booked quarantined (Lease.Quarantine): its Refund returns
// them to free. It fails with memapi.ErrInvalidSize, changing nothing, beyond the
// quarantined bytes.
func (l Lease) QuarantinedAccount() memapi.Account { return quarantinedAccount{l} }

type quarantinedAccount struct{ l Lease }

func (q quarantinedAccount) Authority() memapi.AuthorityID { return q.l.Authority() }
func (q quarantinedAccount) Refund(n memapi.Bytes) error   { return q.l.refundQuarantined(n) }

// Part is one account of a Split and the most bytes it takes.
type Part struct {
	Account memapi.Account
	Bytes   memapi.Bytes
}

// Split returns the account of one release that covers several accounts
// of authority (a decommit of adjacent commits): its Refund(n) refunds each
// part in order, up to the part's Bytes, until n is spent, and fails with
// memapi.ErrInvalidSize for the bytes beyond them all (joined with the
// parts' own failures). A part of another authority fails the whole
// refund with memapi.ErrAuthorityMismatch before any part is refunded (and
// IssuedAccount does not vouch for the split): a release on one authority
// never refunds another's lease. parts is not copied. A split with no
// parts is the account of a release that should have nothing left to
// refund (a reservation of addresses): Refund(0) succeeds, and any other
// refund is an accounting error, reported with memapi.ErrInvalidSize,
// never dropped.
func (g *Governor) Split(authority memapi.AuthorityID, parts []Part) memapi.Account {
	return &splitAccount{g: g, auth: authority, parts: parts}
}

type splitAccount struct {
	g     *Governor
	auth  memapi.AuthorityID
	parts []Part
}

func (s *splitAccount) Authority() memapi.AuthorityID { return s.auth }

func (s *splitAccount) Refund(n memapi.Bytes) error {
	if p, ok := s.foreignPart(); !ok {
		what := "a nil account"
		if p.Account != nil {
			what = "an account of authority " + string(p.Account.Authority())
		}
		return &memapi.Error{Op: "governor.Split.Refund", Kind: memapi.ErrAuthorityMismatch, Authority: s.auth, Wanted: n,
			Detail: "a part is " + what + ", not of the split's; nothing was refunded"}
	}
	var errs []error
	for _, p := range s.parts {
		k := min(n, p.Bytes)
		if k == 0 {
			break
		}
		errs = append(errs, p.Account.Refund(k))
		n -= k
	}
	if n != 0 {
		errs = append(errs, &memapi.Error{Op: "governor.Split.Refund", Kind: memapi.ErrInvalidSize, Authority: s.auth, Wanted: n, Detail: "refund larger than the split's parts"})
	}
	return errors.Join(errs...)
}

// foreignPart returns the first part of another authority than the split's
// (a nil account among them), and false; or true when every part is the
// split's.
func (s *splitAccount) foreignPart() (Part, bool) {
	for _, p := range s.parts {
		if p.Account == nil || p.Account.Authority() != s.auth {
			return p, false
		}
	}
	return Part{}, true
}

// IssuedAccount reports whether a is a Grant or a Lease of the governor,
// or one of the accounts it issues over them (Lease.QuarantinedAccount,
// Split) whose every account is its own and on the split's authority, and
// the authority it refunds to, as the governor booked it.
func (l vouch) IssuedAccount(x memapi.Account) (memapi.AuthorityID, bool) {
	g := l.g
	var gr *grant
	switch v := x.(type) {
	case Lease:
		gr = v.g
	case Grant:
		gr = v.g
	case quarantinedAccount:
		gr = v.l.g
	case *splitAccount:
		if v == nil || v.g != g {
			return "", false
		}
		for _, p := range v.parts {
			if a, ok := l.IssuedAccount(p.Account); !ok || a != v.auth {
				return "", false
			}
		}
		return v.auth, true
	}
	if gr == nil || gr.a.g != g {
		return "", false
	}
	return gr.a.id, true
}
