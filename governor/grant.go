package governor

import (
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// A grant's state and drawn bytes share one atomic word, so Draw and Undraw
// on an open grant take no lock and a transition (commit, cancel, expiry)
// reads exactly the bytes drawn at the instant it happens.
const (
	stateShift           = 62
	drawnMask            = 1<<stateShift - 1
	stateOpen     uint64 = 0
	stateCommit   uint64 = 1
	stateCancel   uint64 = 2
	stateExpired  uint64 = 3
	opDraw               = "governor.Grant.Draw"
	opUndraw             = "governor.Grant.Undraw"
	opGrantCommit        = "governor.Grant.Commit"
	opGrantCancel        = "governor.Grant.Cancel"
)

// Grant is a provisional budget on one authority for one holder, made by
// Governor.Reserve. Physical commits draw from it (it is the memapi.Grant the
// checked wrappers draw from); Commit turns the drawn bytes into a Lease and
// returns the rest; Cancel returns everything once nothing is drawn. Refund
// (memapi.Account) un-draws, so a rollback can refund to the grant.
//
// All methods are safe for concurrent use.
type Grant struct {
	auth     *authority
	acct     *account
	role     Role
	size     memapi.Bytes
	priority Priority
	state    atomic.Uint64
	dl       *grantDeadline // nil without a deadline, which keeps Grant small

	lease Lease // handed out by Commit: one allocation per grant and lease
}

// grantDeadline is the deadline part of a grant.
type grantDeadline struct {
	at time.Time
	// guarded by auth.mu
	timer        Timer // nil once stopped or fired
	tprev, tnext *Grant
}

var (
	_ memapi.Grant   = (*Grant)(nil)
	_ memapi.Account = (*Grant)(nil)
)

// Authority returns the authority the grant draws on.
func (gr *Grant) Authority() memapi.AuthorityID { return gr.auth.id }

// Holder returns the holder the grant was reserved for.
func (gr *Grant) Holder() HolderID { return gr.acct.h.id }

// Role returns what the grant was reserved for.
func (gr *Grant) Role() Role { return gr.role }

// Size returns the bytes granted.
func (gr *Grant) Size() memapi.Bytes { return gr.size }

// Priority returns the priority the grant was reserved with.
func (gr *Grant) Priority() Priority { return gr.priority }

// Deadline returns the grant's deadline (zero: none).
func (gr *Grant) Deadline() time.Time {
	if gr.dl == nil {
		return time.Time{}
	}
	return gr.dl.at
}

// Drawn returns the bytes drawn now.
func (gr *Grant) Drawn() memapi.Bytes { return memapi.Bytes(gr.state.Load() & drawnMask) }

// Remaining returns the bytes that can still be drawn (0 once closed).
func (gr *Grant) Remaining() memapi.Bytes {
	w := gr.state.Load()
	if w>>stateShift != stateOpen {
		return 0
	}
	return gr.size - memapi.Bytes(w&drawnMask)
}

// Open reports whether the grant can still be drawn from and committed.
func (gr *Grant) Open() bool { return gr.state.Load()>>stateShift == stateOpen && !gr.pastDeadline() }

// Draw takes n bytes from the grant. It fails with memapi.ErrGrantExhausted
// when fewer remain and with memapi.ErrGrantClosed once the grant was
// committed, cancelled or reclaimed after its deadline; then nothing changes.
func (gr *Grant) Draw(n memapi.Bytes) error {
	if gr.pastDeadline() {
		gr.expire()
	}
	for {
		w := gr.state.Load()
		if st := w >> stateShift; st != stateOpen {
			return gr.closedError(opDraw, st)
		}
		d := memapi.Bytes(w & drawnMask)
		if n > gr.size-d {
			return opError(opDraw, memapi.ErrGrantExhausted, gr.auth.id, n, gr.size-d, "")
		}
		if n == 0 || gr.state.CompareAndSwap(w, w+uint64(n)) {
			return nil
		}
	}
}

// Undraw gives back n drawn bytes. On an open grant they can be drawn again;
// on a grant reclaimed after its deadline they return to the authority's
// free bytes. It fails with ErrOverReturn beyond the drawn bytes and with
// memapi.ErrGrantClosed after Commit (refund the lease instead) or Cancel.
func (gr *Grant) Undraw(n memapi.Bytes) error { return gr.undraw(opUndraw, n) }

// Refund is Undraw: a refund to an open grant rolls back a commit made
// against it (memapi.Account).
func (gr *Grant) Refund(n memapi.Bytes) error { return gr.undraw("governor.Grant.Refund", n) }

func (gr *Grant) undraw(op string, n memapi.Bytes) error {
	for {
		w := gr.state.Load()
		st := w >> stateShift
		if st == stateCommit || st == stateCancel {
			return gr.closedError(op, st)
		}
		d := memapi.Bytes(w & drawnMask)
		if n > d {
			return opError(op, ErrOverReturn, gr.auth.id, n, d, "undraw beyond the drawn bytes")
		}
		if n == 0 {
			return nil
		}
		if !gr.state.CompareAndSwap(w, w-uint64(n)) {
			continue
		}
		if st == stateExpired {
			// Expiry moved the state under the lock before this CAS saw
			// it, so taking the lock now orders this after the expiry's
			// booking of the drawn bytes.
			a := gr.auth
			a.mu.Lock()
			a.reserved -= n
			a.expiredDrawn -= n
			gr.acct.reserved -= n
			a.serveLocked()
			a.mu.Unlock()
		}
		return nil
	}
}

// Commit closes the grant and returns the holder's lease for the drawn
// bytes; the undrawn rest returns to free. A grant with nothing drawn gives
// an empty lease. It fails with memapi.ErrGrantClosed after Commit, Cancel or
// the deadline.
func (gr *Grant) Commit() (*Lease, error) {
	if gr.pastDeadline() {
		gr.expire()
	}
	a := gr.auth
	a.mu.Lock()
	d, ok := gr.transition(stateCommit)
	if !ok {
		a.mu.Unlock()
		return nil, gr.closedError(opGrantCommit, gr.state.Load()>>stateShift)
	}
	c := gr.acct
	a.closeGrantLocked(gr)
	a.reserved -= gr.size
	c.reserved -= gr.size
	a.charged += d
	c.charged += d
	gr.lease.charged = d
	if d != 0 {
		a.leases++
		c.leases++
	}
	if d != gr.size {
		a.serveLocked()
	}
	a.mu.Unlock()
	return &gr.lease, nil
}

// Cancel returns the whole grant to free. It fails with memapi.ErrInUse,
// changing nothing, while bytes are drawn: backing installed against the
// grant must be removed and undrawn (or refunded) first, so the ledger never
// forgets installed bytes. Cancelling a cancelled or expired grant with
// nothing drawn is a no-op; after Commit it fails with memapi.ErrGrantClosed.
func (gr *Grant) Cancel() error {
	a := gr.auth
	a.mu.Lock()
	for {
		w := gr.state.Load()
		st, d := w>>stateShift, memapi.Bytes(w&drawnMask)
		switch {
		case st == stateCommit:
			a.mu.Unlock()
			return gr.closedError(opGrantCancel, st)
		case d != 0:
			a.mu.Unlock()
			return opError(opGrantCancel, memapi.ErrInUse, a.id, d, 0, "bytes still drawn: remove the backing and undraw first")
		case st != stateOpen:
			a.mu.Unlock()
			return nil
		}
		if gr.state.CompareAndSwap(w, stateCancel<<stateShift) {
			break
		}
	}
	a.closeGrantLocked(gr)
	a.reserved -= gr.size
	gr.acct.reserved -= gr.size
	a.serveLocked()
	a.mu.Unlock()
	return nil
}

// expire reclaims an open grant past its deadline: the undrawn bytes return
// to free; the drawn ones stay reserved until undrawn.
func (gr *Grant) expire() {
	a := gr.auth
	a.mu.Lock()
	d, ok := gr.transition(stateExpired)
	if !ok {
		a.mu.Unlock()
		return
	}
	a.closeGrantLocked(gr)
	back := gr.size - d
	a.reserved -= back
	gr.acct.reserved -= back
	a.expiredDrawn += d
	a.expired++
	a.serveLocked()
	a.mu.Unlock()
	a.g.log.Debug("governor: grant expired", "authority", a.id, "holder", gr.acct.h.id, "role", gr.role, "returned", back, "drawn", d)
	a.g.emit(Event{Kind: EventGrantExpired, Authority: a.id, Holder: gr.acct.h.id, Role: gr.role, Bytes: back, Drawn: d})
}

// transition moves an open grant to st and returns the bytes drawn at that
// instant. Called with the authority's mutex held.
func (gr *Grant) transition(st uint64) (memapi.Bytes, bool) {
	for {
		w := gr.state.Load()
		if w>>stateShift != stateOpen {
			return 0, false
		}
		if gr.state.CompareAndSwap(w, st<<stateShift|w&drawnMask) {
			return memapi.Bytes(w & drawnMask), true
		}
	}
}

func (gr *Grant) pastDeadline() bool {
	return gr.dl != nil && !gr.auth.g.clock.Now().Before(gr.dl.at)
}

func (gr *Grant) closedError(op string, st uint64) error {
	e := opError(op, memapi.ErrGrantClosed, gr.auth.id, 0, 0, "")
	switch st {
	case stateCommit:
		e.Detail = "committed"
	case stateCancel:
		e.Detail = "cancelled"
	case stateExpired:
		e.Detail = "reclaimed after its deadline"
		e.Err = ErrExpired
	}
	return e
}
