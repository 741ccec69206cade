package governor

import (
	"context"
	"time"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// grantState is where a grant is in its life. A grant starts open; commit,
// cancel and expiry each end it, once.
type grantState uint8

const (
	stateOpen      grantState = iota
	stateCommitted            // its lease holds the drawn bytes
	stateCancelled
	stateExpired // reclaimed after its deadline; drawn bytes stay reserved until undrawn
)

const (
	opDraw        = "governor.Grant.Draw"
	opUndraw      = "governor.Grant.Undraw"
	opGrantCommit = "governor.Grant.Commit"
	opGrantCancel = "governor.Grant.Cancel"
)

// Grant is a provisional budget on one authority for one holder, made by
// Governor.Reserve. Physical commits draw from it (it is the memapi.Grant the
// checked wrappers draw from); Commit turns the drawn bytes into a Lease and
// returns the rest; Cancel returns everything once nothing is drawn. Refund
// (memapi.Account) un-draws, so a rollback can refund to the grant.
//
// A Grant is a handle on the governor's record of one reservation. Every
// Reserve makes a new record and no record is ever reused, so a handle
// always names its own reservation: once the grant was committed, cancelled
// or reclaimed, every use of the handle fails with memapi.ErrGrantClosed,
// whatever was reserved since. A copy of a Grant is the same handle: both
// see one record, so the bytes are drawn, committed or returned once.
//
// The zero Grant was never reserved: it reads as closed and refuses every use.
//
// All methods are safe for concurrent use.
type Grant struct{ g *grant }

// grant is the governor's record of one reservation and, once committed,
// of its lease. Its fixed fields are written before any handle exists; the
// others are guarded by the authority's mutex.
type grant struct {
	a    *authority
	acct *account // the holder's account on a
	size memapi.Bytes
	dl   *grantDeadline // nil: no deadline (which keeps the record small)

	// Its own share of the ledger, kept in three numbers (figures holds
	// eight) so that the record, allocated by every Reserve, fits in 64
	// bytes: which figure each stands for depends on state.
	bytes       memapi.Bytes // drawn while open or expired; charged (quarantined included) once committed
	pending     memapi.Bytes // its lease's bytes released and waiting for fences
	quarantined memapi.Bytes // the part of a lease's charge whose free failed

	state  grantState
	checks bool // set when booked: it has a deadline, or the governor an Injector (see Grant.enter)
}

// grantDeadline is a grant's deadline and its timer, which runs until it
// fired or the grant ended (guarded by the authority's mutex).
type grantDeadline struct {
	at    time.Time
	timer func() bool // stops the timer (Clock.AfterFunc)
	role  string      // the reservation's, for the expiry's event
}

// drawn is what is drawn from gr, open or expired.
func (gr *grant) drawn() memapi.Bytes {
	if gr.state == stateOpen || gr.state == stateExpired {
		return gr.bytes
	}
	return 0
}

var (
	_ memapi.Grant   = Grant{}
	_ memapi.Account = Grant{}
)

// Ledger returns the governor as a checked.Ledger: a checked wrapper built
// with it (checked.Wrap(mech, g.Ledger())) accepts only the grants and
// leases this governor issued. A grant of another governor, a zero Grant
// never reserved, or a hand-made value with a Grant's methods is refused
// (memapi.ErrForeignGrant) before anything is drawn. Recognition is by
// concrete type and the link every issued grant keeps to its governor
// (through its authority), which no code outside the package can set.
func (g *Governor) Ledger() checked.Ledger { return vouch{g} }

// vouch is the governor's checked.Ledger.
type vouch struct{ g *Governor }

// IssuedGrant reports whether x is a Grant the governor reserved, and the
// authority it draws on.
func (l vouch) IssuedGrant(x memapi.Grant) (memapi.AuthorityID, bool) {
	if gr, ok := x.(Grant); ok && gr.g != nil && gr.g.a.g == l.g {
		return gr.g.a.id, true
	}
	return "", false
}

// Authority returns the authority the grant draws on ("" for a zero Grant).
func (h Grant) Authority() memapi.AuthorityID {
	if h.g == nil {
		return ""
	}
	return h.g.a.id
}

// Size returns the bytes granted (0 for a zero Grant).
func (h Grant) Size() memapi.Bytes {
	if h.g == nil {
		return 0
	}
	return h.g.size
}

// read calls f with h's record under its authority's lock; not at all for
// a zero Grant.
func (h Grant) read(f func(*grant)) {
	if h.g == nil {
		return
	}
	a := h.g.a
	a.mu.Lock()
	f(h.g)
	a.mu.Unlock()
}

// Each method that changes a grant or its lease starts the same way: it
// takes its authority's lock at once when the record has nothing to check
// first, and calls enter before that when it has (a zero handle, an
// Injector, a deadline: record.checks).

// Draw takes n bytes from the grant. It fails with memapi.ErrGrantExhausted
// when fewer remain and with memapi.ErrGrantClosed once the grant was
// committed, cancelled or reclaimed after its deadline; then nothing changes.
func (h Grant) Draw(n memapi.Bytes) error {
	gr := h.g
	if gr == nil || gr.checks {
		if err := h.enter(opDraw, n, true); err != nil {
			return err
		}
	}
	a := gr.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if gr.state != stateOpen {
		return gr.closedError(opDraw)
	}
	if left := gr.size - gr.bytes; n > left {
		return opError(opDraw, memapi.ErrGrantExhausted, a.id, n, left, "")
	}
	gr.bytes += n
	for _, f := range gr.acct.books {
		f.drawn += n
	}
	return nil
}

// Undraw gives back n drawn bytes. On an open grant they can be drawn again;
// on a grant reclaimed after its deadline they return to the authority's
// free bytes. It fails with memapi.ErrInvalidSize beyond the drawn bytes and with
// memapi.ErrGrantClosed after Commit (refund the lease instead) or Cancel.
func (h Grant) Undraw(n memapi.Bytes) error { return h.undraw(opUndraw, n) }

// Refund is Undraw: a refund to an open grant rolls back a commit made
// against it (memapi.Account).
func (h Grant) Refund(n memapi.Bytes) error { return h.undraw("governor.Grant.Refund", n) }

func (h Grant) undraw(op string, n memapi.Bytes) error {
	gr := h.g
	if gr == nil || gr.checks {
		if err := h.enter(op, n, true); err != nil {
			return err
		}
	}
	a := gr.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if gr.state != stateOpen && gr.state != stateExpired {
		return gr.closedError(op)
	}
	if d := gr.drawn(); n > d {
		return opError(op, errOverReturn, a.id, n, d, "undraw beyond the drawn bytes")
	}
	a.undraw(gr, n)
	return nil
}

// Commit closes the grant and returns the holder's lease for the drawn
// bytes; the undrawn rest returns to free. A grant with nothing drawn gives
// an empty lease. It fails with memapi.ErrGrantClosed after Commit, Cancel or
// the deadline.
func (h Grant) Commit() (Lease, error) {
	gr := h.g
	if gr == nil || gr.checks {
		if err := h.enter(opGrantCommit, 0, true); err != nil {
			return Lease{}, err
		}
	}
	a := gr.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if gr.state != stateOpen {
		return Lease{}, gr.closedError(opGrantCommit)
	}
	// The transition: the drawn bytes become the lease's charge, the rest
	// returns to free.
	d, size := gr.bytes, gr.size
	gr.state = stateCommitted // gr.bytes: drawn, now charged
	if gr.dl != nil {
		a.stopTimer(gr)
	}
	for _, f := range gr.acct.books {
		f.reserved -= size
		f.drawn -= d
		f.charged += d
		f.grants--
		if d != 0 {
			f.leases++
		}
	}
	if d != size && a.head != nil {
		a.serve()
	}
	return Lease(h), nil
}

// Cancel returns the whole grant to free. It fails with memapi.ErrInUse,
// changing nothing, while bytes are drawn: backing installed against the
// grant must be removed and undrawn (or refunded) first, so the ledger never
// forgets installed bytes. Cancelling a cancelled or expired grant with
// nothing drawn is a no-op; after Commit it fails with memapi.ErrGrantClosed.
func (h Grant) Cancel() error {
	gr := h.g
	if gr == nil || gr.checks {
		if err := h.enter(opGrantCancel, 0, true); err != nil {
			return err
		}
	}
	a := gr.a
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case gr.state == stateCommitted:
		return gr.closedError(opGrantCancel)
	case gr.drawn() != 0:
		return opError(opGrantCancel, memapi.ErrInUse, a.id, gr.drawn(), 0, "bytes still drawn: remove the backing and undraw first")
	case gr.state == stateOpen:
		a.cancel(gr)
	}
	return nil
}

// enter is what a method that changes a grant or its lease does before it
// takes the authority's lock when the record has something to check
// (record.checks, or a zero handle): it refuses a zero handle, consults the
// Injector at op when asked, and reclaims the grant first when its deadline
// passed. The clock is read before the lock, so a Clock never runs under it.
func (h Grant) enter(op string, n memapi.Bytes, inject bool) error {
	gr := h.g
	if gr == nil {
		return opError(op, memapi.ErrGrantClosed, "", 0, 0, "never reserved")
	}
	a := gr.a
	if a.g.inject != nil && inject {
		if err := a.g.injected(op, a.id, n); err != nil {
			return err
		}
	}
	if gr.dl != nil && !a.g.clock.Now().Before(gr.dl.at) {
		gr.expire()
	}
	return nil
}

// expire reclaims gr if it is still open: called by its deadline timer, and
// by a method that finds the deadline passed before the timer fired.
func (gr *grant) expire() {
	a := gr.a
	a.mu.Lock()
	if gr.state != stateOpen {
		a.mu.Unlock()
		return
	}
	back, drawn := gr.size-gr.bytes, gr.bytes
	a.expire(gr)
	a.mu.Unlock()
	a.g.log.Debug("governor: grant expired", "authority", a.id, "holder", gr.acct.h.id, "role", gr.dl.role, "returned", back, "drawn", drawn)
	a.g.emit(Event{Kind: EventGrantExpired, Authority: a.id, Holder: gr.acct.h.id, Role: gr.dl.role, Bytes: back, Drawn: drawn})
}

// closedError is the failure of a method of an open grant on gr, which is
// not open.
func (gr *grant) closedError(op string) error {
	e := opError(op, memapi.ErrGrantClosed, gr.a.id, 0, 0, "")
	switch gr.state {
	case stateCommitted:
		e.Detail = "committed"
	case stateCancelled:
		e.Detail = "cancelled"
	case stateExpired:
		e.Detail = "reclaimed after its deadline"
		e.Err = context.DeadlineExceeded
	}
	return e
}
