package governor

import (
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// A grant's state and drawn bytes share one atomic word, so Draw and Undraw
// on an open grant take no lock and a transition (commit, cancel, expiry)
// reads exactly the bytes drawn at the instant it happens.
//
// The word also carries the era of the issue that last wrote it. Each issue
// of a grant under the lock flips the grant's era, so the word of the
// previous, closed issue reads as open with nothing drawn: reissuing a grant
// writes no atomic word (Grant.load).
//
// And it counts the issues made without the lock (Reserve of a spare grant
// whose lease was just refunded whole, Grant.reissue) that the
// authority has not booked yet: whoever moves the grant under the lock
// books them in Granted. At genMax the next reissue takes the lock.
const (
	stateShift           = 61
	eraBit               = 1 << (stateShift - 1)
	genShift             = 52
	genMax               = 1<<(stateShift-1-genShift) - 1
	genMask              = genMax << genShift
	drawnMask            = 1<<genShift - 1
	stateOpen     uint64 = 0
	stateCommit   uint64 = 1 // committed without the lock, not settled yet (authority.settleLocked)
	stateCancel   uint64 = 2
	stateExpired  uint64 = 3
	stateClaimed  uint64 = 4 // a spare grant held by a reservation that waits; closed to every use
	stateUnissued uint64 = 5 // a zero Grant never reserved (read by load, never stored)
	stateSettled  uint64 = 6 // committed, and booked: the lease's figures are its own
	stateRefunded uint64 = 7 // committed, then its lease refunded whole, neither settled yet
	stateCopied   uint64 = 8 // a copy of an issued grant (read by load, never stored: not in the word's 3 bits)
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
// The governor recycles grants: once a grant was cancelled, or committed
// and its lease refunded whole, a later Reserve may issue it again (see
// Reserve), so a steady stream of reservations allocates nothing.
//
// A Grant is used through its pointer only. A copy of an issued Grant (a
// value copy, `cp := *gr`, which go vet's copylocks flags) is refused by
// every method that can fail, with ErrCopiedGrant, and reads as closed:
// an issued grant is the one its lease points back to (lease.g), which a
// copy is not, so a copy can neither return nor draw the bytes of the
// reservation it was copied from.
//
// All methods are safe for concurrent use.
type Grant struct {
	acct     *account // nil until first issued; its authority never changes after
	role     Role
	sizeEra  uint64 // the size, and in eraBit this era (see load)
	priority Priority
	state    atomic.Uint64
	dl       *grantDeadline // nil without a deadline, which keeps Grant small
	inj      Injector       // the governor's Options.Injector, or nil: set at the first issue

	// guarded by the authority's mutex: the grant's place in its list of
	// unsettled grants (see authority.settleLocked)
	uprev, unext *Grant

	lease Lease // handed out by Commit: one allocation per grant and lease
}

// grantDeadline is the deadline part of a grant.
type grantDeadline struct {
	at time.Time
	// guarded by the authority's mutex
	timer        Timer // nil once stopped or fired
	tprev, tnext *Grant
}

var (
	_ memapi.Grant   = (*Grant)(nil)
	_ memapi.Account = (*Grant)(nil)
)

// Authority returns the authority the grant draws on ("" for a zero Grant).
func (gr *Grant) Authority() memapi.AuthorityID {
	if gr.acct == nil {
		return ""
	}
	return gr.acct.a.id
}

// Holder returns the holder the grant was reserved for ("" for a zero Grant).
func (gr *Grant) Holder() HolderID {
	if gr.acct == nil {
		return ""
	}
	return gr.acct.h.id
}

// Role returns what the grant was reserved for.
func (gr *Grant) Role() Role { return gr.role }

// Size returns the bytes granted.
func (gr *Grant) Size() memapi.Bytes { return gr.sz() }

// sz is the size; sizes never reach eraBit (maxBytes).
func (gr *Grant) sz() memapi.Bytes { return memapi.Bytes(gr.sizeEra & drawnMask) }

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
func (gr *Grant) Drawn() memapi.Bytes {
	_, _, d := gr.load()
	return d
}

// Remaining returns the bytes that can still be drawn (0 once closed).
func (gr *Grant) Remaining() memapi.Bytes {
	_, st, d := gr.load()
	if st != stateOpen {
		return 0
	}
	return gr.sz() - d
}

// Open reports whether the grant can still be drawn from and committed.
func (gr *Grant) Open() bool {
	_, st, _ := gr.load()
	return st == stateOpen && !gr.pastDeadline()
}

// load returns the state word (to compare-and-swap from), and the state and
// drawn bytes of the grant's current issue: a word another era wrote belongs
// to the previous issue, closed before the grant was issued again, and reads
// as open with nothing drawn.
//
// A zero Grant, never reserved, reads as stateUnissued, and a copy of an
// issued one as stateCopied: closed to every use.
func (gr *Grant) load() (w, st uint64, d memapi.Bytes) {
	w = gr.state.Load()
	if gr.acct == nil {
		return w, stateUnissued, 0
	}
	if gr.copied() {
		return w, stateCopied, 0
	}
	if w&eraBit != gr.sizeEra&eraBit {
		return w, stateOpen, 0
	}
	return w, w >> stateShift, memapi.Bytes(w & drawnMask)
}

// copied reports whether gr is a copy of an issued grant: the grant its
// lease points back to is another. The link is set at the first issue,
// before the grant is handed out, and never changes.
func (gr *Grant) copied() bool { return gr.acct != nil && gr.lease.g != gr }

// word is the state word of this issue in state st with d bytes drawn and
// no reissue left to book: for the swaps made under the lock, which book
// what w held (bookGen).
func (gr *Grant) word(st uint64, d memapi.Bytes) uint64 {
	return st<<stateShift | gr.sizeEra&eraBit | uint64(d)
}

// keep is word(st, d) still counting w's reissues: for the swaps made
// without the lock.
func (gr *Grant) keep(w, st uint64, d memapi.Bytes) uint64 {
	return gr.word(st, d) | gr.gen(w)<<genShift
}

// gen returns the reissues without the lock that w counts (none in a word
// of a previous issue: they were booked when it was issued again).
func (gr *Grant) gen(w uint64) uint64 {
	if w&eraBit != gr.sizeEra&eraBit {
		return 0
	}
	return w & genMask >> genShift
}

// bookGen books in the authority's Granted the reissues w counted, once a
// swap under the lock replaced it by a word that counts none.
func (gr *Grant) bookGen(a *authority, w uint64) { a.granted += gr.gen(w) }

// reissue issues again, without the lock, a grant whose lease was refunded
// whole and not settled since: its size stays reserved all along, for the
// same holder, role and priority, so nothing in the ledger moves; only the
// word swaps from refunded back to open, counting one more issue to book.
// Any settle turns a refunded grant to settled first (Unregister,
// RemoveAuthority, SetCapacity and a reservation that waits or fails all
// settle), so the swap fails, changing nothing, once the reservation would
// need the lock: to wait its turn, to fail, or to book. After Close the
// caller does not try (authority.closed): a grant open at Close may still
// be committed and refunded without the lock.
func (gr *Grant) reissue() bool {
	w, st, _ := gr.load()
	if st != stateRefunded || gr.gen(w) == genMax {
		return false
	}
	return gr.state.CompareAndSwap(w, gr.word(stateOpen, 0)|(gr.gen(w)+1)<<genShift)
}

// Draw takes n bytes from the grant. It fails with memapi.ErrGrantExhausted
// when fewer remain and with memapi.ErrGrantClosed once the grant was
// committed, cancelled or reclaimed after its deadline; then nothing changes.
func (gr *Grant) Draw(n memapi.Bytes) error {
	if err := gr.inject(OpDraw, n); err != nil {
		return err
	}
	if gr.dl != nil && gr.pastDeadline() {
		gr.expire()
	}
	for {
		w, st, d := gr.load()
		if st != stateOpen {
			return gr.closedError(opDraw, st)
		}
		if n > gr.sz()-d {
			return opError(opDraw, memapi.ErrGrantExhausted, gr.acct.a.id, n, gr.sz()-d, "")
		}
		if n == 0 || gr.state.CompareAndSwap(w, gr.keep(w, stateOpen, d+n)) {
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
	if err := gr.inject(OpUndraw, n); err != nil {
		return err
	}
	for {
		w, st, d := gr.load()
		if st != stateOpen && st != stateExpired {
			return gr.closedError(op, st)
		}
		if n > d {
			return opError(op, ErrOverReturn, gr.acct.a.id, n, d, "undraw beyond the drawn bytes")
		}
		if n == 0 {
			return nil
		}
		if !gr.state.CompareAndSwap(w, gr.keep(w, st, d-n)) {
			continue
		}
		if st == stateExpired {
			// Expiry moved the state under the lock before this CAS saw
			// it, so taking the lock now orders this after the expiry's
			// booking of the drawn bytes.
			a := gr.acct.a
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
	if err := gr.inject(OpCommit, 0); err != nil {
		return nil, err
	}
	if gr.dl == nil {
		// Every byte drawn and no timer to stop: no byte returns to free,
		// so no waiter can be served and the free figure does not move.
		// The commit is then this one compare-and-swap; the authority
		// settles the moves from reserved to charged under its lock before
		// anything reads them (authority.settleLocked).
		w, st, d := gr.load()
		if st == stateOpen && d != 0 && d == gr.sz() && gr.state.CompareAndSwap(w, gr.keep(w, stateCommit, d)) {
			return &gr.lease, nil
		}
		if st == stateUnissued {
			return nil, gr.closedError(opGrantCommit, st)
		}
	} else if gr.pastDeadline() {
		gr.expire()
	}
	a := gr.acct.a
	a.mu.Lock()
	d, ok := gr.transition(stateSettled)
	if !ok {
		_, st, _ := gr.load()
		a.mu.Unlock()
		return nil, gr.closedError(opGrantCommit, st)
	}
	a.bookCommitLocked(gr, d)
	if d != gr.sz() {
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
	if _, st, _ := gr.load(); st == stateUnissued || st == stateCopied {
		return gr.closedError(opGrantCancel, st)
	}
	if err := gr.inject(OpCancel, 0); err != nil {
		return err
	}
	a := gr.acct.a
	a.mu.Lock()
	for {
		w, st, d := gr.load()
		switch {
		case st == stateCommit || st == stateSettled || st == stateRefunded:
			a.mu.Unlock()
			return gr.closedError(opGrantCancel, st)
		case st == stateClaimed:
			a.mu.Unlock()
			return gr.closedError(opGrantCancel, st)
		case d != 0:
			a.mu.Unlock()
			return opError(opGrantCancel, memapi.ErrInUse, a.id, d, 0, "bytes still drawn: remove the backing and undraw first")
		case st != stateOpen:
			a.mu.Unlock()
			return nil
		}
		if gr.state.CompareAndSwap(w, gr.word(stateCancel, 0)) {
			gr.bookGen(a, w)
			break
		}
	}
	a.closeGrantLocked(gr)
	a.reserved -= gr.sz()
	gr.acct.reserved -= gr.sz()
	a.serveLocked()
	a.mu.Unlock()
	a.putSpare(gr)
	return nil
}

// inject consults the governor's Injector (Options.Injector) at op on an
// issued grant; nil when there is none.
func (gr *Grant) inject(op Op, n memapi.Bytes) error {
	if gr.inj == nil {
		return nil
	}
	return gr.inj.MaybeError(op, gr.acct.a.id, n)
}

// expire reclaims an open grant past its deadline: the undrawn bytes return
// to free; the drawn ones stay reserved until undrawn.
func (gr *Grant) expire() { gr.expireBy(gr.acct.a, nil) }

// expireBy is expire for the deadline timer armed with dl on the grant's
// authority a: a timer that fires late, after the grant was closed and
// issued again (a spare grant), finds another deadline (or none) and leaves
// the new issue alone. It reads nothing of the grant before taking the lock.
func (gr *Grant) expireBy(a *authority, dl *grantDeadline) {
	a.mu.Lock()
	if dl != nil && gr.dl != dl {
		a.mu.Unlock()
		return
	}
	d, ok := gr.transition(stateExpired)
	if !ok {
		a.mu.Unlock()
		return
	}
	a.closeGrantLocked(gr)
	back := gr.sz() - d
	a.reserved -= back
	gr.acct.reserved -= back
	a.expiredDrawn += d
	a.expired++
	a.serveLocked()
	// Read under the lock: with nothing drawn the grant may be issued
	// again (a spare grant) as soon as it is released.
	holder, role := gr.acct.h.id, gr.role
	a.mu.Unlock()
	a.g.log.Debug("governor: grant expired", "authority", a.id, "holder", holder, "role", role, "returned", back, "drawn", d)
	a.g.emit(Event{Kind: EventGrantExpired, Authority: a.id, Holder: holder, Role: role, Bytes: back, Drawn: d})
}

// transition moves an open grant to st and returns the bytes drawn at that
// instant. Called with the authority's mutex held.
func (gr *Grant) transition(st uint64) (memapi.Bytes, bool) {
	for {
		w, cur, d := gr.load()
		if cur != stateOpen {
			return 0, false
		}
		if gr.state.CompareAndSwap(w, gr.word(st, d)) {
			gr.bookGen(gr.acct.a, w)
			return d, true
		}
	}
}

func (gr *Grant) pastDeadline() bool {
	return gr.dl != nil && !gr.acct.a.g.clock.Now().Before(gr.dl.at)
}

func (gr *Grant) closedError(op string, st uint64) error {
	if st == stateCopied {
		return opError(op, ErrCopiedGrant, gr.Authority(), 0, 0, "a copy of a Grant: use the *Grant the reservation returned")
	}
	e := opError(op, memapi.ErrGrantClosed, gr.Authority(), 0, 0, "")
	switch st {
	case stateCommit, stateSettled, stateRefunded:
		e.Detail = "committed"
	case stateCancel:
		e.Detail = "cancelled"
	case stateExpired:
		e.Detail = "reclaimed after its deadline"
		e.Err = ErrExpired
	case stateClaimed:
		e.Detail = "being reserved again"
	case stateUnissued:
		e.Detail = "never reserved"
	}
	return e
}
