//go:build memgentmpl

package checked

import (
	"errors"
	"fmt"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// charge checks the grant of a consuming call and draws amount, rounded up to
// unit, from it (charge-before-commit). It runs after every other check, so a
// rejected call draws nothing.
func (m *mechanism) charge(op string, grant memapi.Grant, amount, unit memapi.Bytes) (memapi.Bytes, error) {
	if grant == nil {
		return 0, &memapi.Error{
			Authority: m.info.Authority,
			Detail:    "a consuming call needs a grant to draw from",
			Kind:      memapi.ErrNoGrant,
			Mechanism: m.info.Mechanism,
			Op:        op,
			Wanted:    amount,
		}
	}
	a, ok := m.ledger.IssuedGrant(grant)
	if !ok {
		return 0, m.foreignGrant(op, "grant", grant)
	}
	if a != m.info.Authority {
		return 0, m.foreignAuthority(op, "grant", a)
	}
	n, ok := memapi.RoundUp(amount, unit)
	if !ok {
		return 0, m.overflow(op, amount, unit)
	}
	if err := grant.Draw(n); err != nil {
		return 0, err
	}
	return n, nil
}

// undraw gives back what charge drew for a call that failed with err; when the
// grant refuses, both errors are returned.
func (m *mechanism) undraw(grant memapi.Grant, n memapi.Bytes, err error) error {
	if uerr := grant.Undraw(n); uerr != nil {
		return errors.Join(err, uerr)
	}
	return err
}

// abandon gives back the n bytes a consuming call drew from grant when the
// mechanism's call did not return: it panicked (the panic goes on, unrecovered)
// or ended its goroutine. The grant's own error, if any, cannot be reported.
func (m *mechanism) abandon(grant memapi.Grant, n memapi.Bytes, returned *bool) {
	if !*returned {
		_ = grant.Undraw(n)
	}
}

// book is the wrapper's claim on memapi's ChargeBook, made once when the
// package is initialized: the committed bytes charged through any checked
// wrapper against a reservation-like handle are kept in the handle itself, so
// that a refund of what is committed in it (committed(h) in the spec) reads
// that figure instead of asking the mechanism first. No other code can change
// the figures.
var book = func() *memapi.ChargeBook {
	b := memapi.ClaimChargeBook()
	if b == nil {
		panic("checked: memapi's ChargeBook was claimed before package checked")
	}
	return b
}()

// round rounds amount up to unit, failing with ErrInvalidSize on overflow.
func (m *mechanism) round(op string, amount, unit memapi.Bytes) (memapi.Bytes, error) {
	n, ok := memapi.RoundUp(amount, unit)
	if !ok {
		return 0, m.overflow(op, amount, unit)
	}
	return n, nil
}

// overflow is the error of amount, which overflows when rounded up to unit.
func (m *mechanism) overflow(op string, amount, unit memapi.Bytes) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Detail:    fmt.Sprintf("%d bytes overflow when rounded up to %d", amount, unit),
		Kind:      memapi.ErrInvalidSize,
		Mechanism: m.info.Mechanism,
		Op:        op,
		Wanted:    amount,
	}
}

// account checks the account of a refunding call before the mechanism runs.
func (m *mechanism) account(op string, to memapi.Account) error {
	if to == nil {
		return &memapi.Error{
			Authority: m.info.Authority,
			Detail:    "a refunding call needs an account to refund to",
			Kind:      memapi.ErrNoAccount,
			Mechanism: m.info.Mechanism,
			Op:        op,
		}
	}
	a, ok := m.ledger.IssuedAccount(to)
	if !ok {
		return m.foreignGrant(op, "account", to)
	}
	if a != m.info.Authority {
		return m.foreignAuthority(op, "account", a)
	}
	return nil
}

// refund returns n released bytes to the account (nothing to do for 0).
func refund(to memapi.Account, n memapi.Bytes) error {
	if n == 0 {
		return nil
	}
	return to.Refund(n)
}

// foreignGrant reports a grant or account the wrapper's ledger does not vouch
// for. It names the value's type, never its methods' answers: a forged value
// says what it likes about itself.
func (m *mechanism) foreignGrant(op, what string, v any) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Detail:    fmt.Sprintf("%s of type %T was not issued by a ledger this wrapper trusts", what, v),
		Kind:      memapi.ErrForeignGrant,
		Mechanism: m.info.Mechanism,
		Op:        op,
	}
}

// foreignAuthority reports a grant or account of another authority than the
// mechanism's.
func (m *mechanism) foreignAuthority(op, what string, a memapi.AuthorityID) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Detail:    fmt.Sprintf("%s of authority %q, mechanism of authority %q", what, a, m.info.Authority),
		Kind:      memapi.ErrAuthorityMismatch,
		Mechanism: m.info.Mechanism,
		Op:        op,
	}
}

// errPositive reports a zero amount (requires positive(...)).
func (m *mechanism) errPositive(op, req string) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Detail:    "zero size (requires " + req + ")",
		Kind:      memapi.ErrInvalidSize,
		Mechanism: m.info.Mechanism,
		Op:        op,
	}
}

// errWithin reports a range that is empty or leaves its handle (requires
// within(...)).
func (m *mechanism) errWithin(op, req string, r memapi.Range, h memapi.HandleID, size memapi.Bytes) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Available: size,
		Detail:    fmt.Sprintf("range %v is empty or not within %#x bytes (requires %s)", r, size, req),
		Handle:    h,
		Kind:      memapi.ErrInvalidRange,
		Mechanism: m.info.Mechanism,
		Op:        op,
		Wanted:    r.Len,
	}
}

// errAligned reports a range off the mechanism's granularity (requires
// aligned(...)).
func (m *mechanism) errAligned(op, req string, r memapi.Range) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Detail:    fmt.Sprintf("range %v is not aligned to the granularity %#x (requires %s)", r, m.info.Granularity, req),
		Kind:      memapi.ErrUnaligned,
		Mechanism: m.info.Mechanism,
		Op:        op,
	}
}

// errFits reports a range whose length is not the handle's size (requires
// fits(...)).
func (m *mechanism) errFits(op, req string, r memapi.Range, h memapi.HandleID, size memapi.Bytes) error {
	return &memapi.Error{
		Authority: m.info.Authority,
		Available: r.Len,
		Detail:    fmt.Sprintf("range %v is %#x bytes long, the handle %#x (requires %s)", r, r.Len, size, req),
		Handle:    h,
		Kind:      memapi.ErrInvalidRange,
		Mechanism: m.info.Mechanism,
		Op:        op,
		Wanted:    size,
	}
}
