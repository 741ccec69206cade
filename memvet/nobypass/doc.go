// Package nobypass defines an Analyzer that checks that memory is drawn
// from and refunded to the ledger only through the checked wrapper, and
// that only the ledger packages issue grants and accounts.
//
// # Analyzer nobypass
//
// nobypass: report calls of consuming or refunding capability methods that
// bypass the checked wrapper, and ledger roles implemented outside the
// ledger packages
//
// The consuming and refunding methods are those the spec marks so
// (Allocate, Free, Commit, Decommit, ReleaseReservation, CreateBacking,
// CopyOnWrite, ReleaseBacking today). A call of one, or a method value of
// one, on a value that is not provably the checked wrapper
// (generated/checked) is reported: only the wrapper draws the grant before
// the call, undraws it on failure and refunds after a release, so a direct
// call leaves the ledger behind the memory.
//
//	return s.mech.Allocate(ctx, memapi.AllocRequest{Size: 1 << 20}, g) // Allocate ... is called on a value that is not the checked wrapper
//
// A value is provably the wrapper when it comes from a call into
// generated/checked, from a Require helper or As accessor of such a value,
// or from a variable, field or result every assignment of which in the
// package is such a value.
//
// It also reports a named type, outside the ledger packages (the spec's
// ownership.ledgers: governor, fakes), that implements the grant or the
// account role with a method of its own: a grant the governor did not
// issue can approve anything.
//
//	type counter struct{ s *Server } // counter implements memapi.Account outside the ledger packages
//
//	func (c counter) Authority() memapi.AuthorityID { return "" }
//	func (c counter) Refund(n memapi.Bytes) error   { c.s.freed += n; return nil }
//
// Mechanism packages, generated code and tests are not checked. See
// docs/memvet.md.
package nobypass
