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
	stateStale    uint64 = 8 // a handle of an earlier issue (read by loadAs, never stored: not in the word's 3 bits)
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
// A Grant is a handle: a small value naming the governor's record of the
// grant and the issue of it the handle was made for. The governor recycles
// its records: once a grant was cancelled, or committed and its lease
// refunded whole, a later Reserve may issue the record again (see Reserve),
// so a steady stream of reservations allocates nothing. Each issue counts
// one more generation, and every method compares the handle's generation
// with the record's first: a handle of an earlier issue (a stale handle)
// changes nothing and fails with memapi.ErrGrantClosed caused by
// ErrStaleHandle, so a double Cancel never touches the grant's next holder.
// A copy of a Grant is the same handle: both see one record, so the bytes
// are drawn, committed or returned once.
//
// The zero Grant was never reserved: it reads as closed and refuses every use.
//
// All methods are safe for concurrent use.
type Grant struct {
	g   *grant
	gen uint64 // the issue of g this handle was made for (grant.issue)
}

// grant is the governor's record behind a Grant and its Lease, recycled
// from one issue to the next.
type grant struct {
	// auth and inj are set when the record is made, before its first
	// issue, and never change: a stale handle reads them without the lock.
	auth     *authority
	inj      Injector // the governor's Options.Injector, or nil
	acct     *account // the holder's account of this issue
	role     Role
	sizeEra  atomic.Uint64 // the size, and in eraBit this issue's era (see load)
	priority Priority
	state    atomic.Uint64
	// issue counts the issues of the record: bumped before each issue
	// makes the record usable again, so a handle of an earlier one fails
	// (loadAs).
	issue atomic.Uint64
	dl    atomic.Pointer[grantDeadline] // nil without a deadline, which keeps the record small

	// guarded by the authority's mutex: the grant's place in its list of
	// unsettled grants (see authority.settleLocked)
	uprev, unext *grant

	lease leaseFigures // the figures of the Lease that Commit hands out
}

// grantDeadline is the deadline part of a grant.
type grantDeadline struct {
	at time.Time
	// guarded by the authority's mutex
	timer        Timer // nil once stopped or fired
	tprev, tnext *grant
}

var (
	_ memapi.Grant   = Grant{}
	_ memapi.Account = Grant{}
)

// handle is the Grant of gr's current issue.
func (gr *grant) handle() Grant { return Grant{g: gr, gen: gr.issue.Load()} }

// live reports whether h names the current issue of its record (for the
// getters; the methods that change the record check the issue where they
// read the state word, grant.loadAs).
func (h Grant) live() bool { return !h.zero() && h.g.issue.Load() == h.gen }

// zero reports whether h was never reserved.
func (h Grant) zero() bool { return h.g == nil }

// Authority returns the authority the grant draws on ("" for a zero Grant).
func (h Grant) Authority() memapi.AuthorityID {
	if h.zero() {
		return ""
	}
	return h.g.auth.id
}

// Holder returns the holder the grant was reserved for ("" for a zero or
// stale Grant).
func (h Grant) Holder() HolderID {
	var id HolderID
	h.issued(func(gr *grant) { id = gr.acct.h.id })
	return id
}

// Role returns what the grant was reserved for ("" for a zero or stale Grant).
func (h Grant) Role() Role {
	var r Role
	h.issued(func(gr *grant) { r = gr.role })
	return r
}

// Size returns the bytes granted (0 for a zero or stale Grant).
func (h Grant) Size() memapi.Bytes {
	if !h.live() {
		return 0
	}
	return h.g.sz()
}

// sz is the size; sizes never reach eraBit (maxBytes).
func (gr *grant) sz() memapi.Bytes { return memapi.Bytes(gr.sizeEra.Load() & drawnMask) }

// Priority returns the priority the grant was reserved with.
func (h Grant) Priority() Priority {
	var p Priority
	h.issued(func(gr *grant) { p = gr.priority })
	return p
}

// issued calls read with h's record under the authority's lock when h
// names the record's current issue. The holder, role and priority of a
// record change only under that lock, at its next issue (newGrantLocked,
// queueLocked), so a stale handle's getter never reads them while they
// are written: it reads the zero value instead.
func (h Grant) issued(read func(*grant)) {
	if h.zero() {
		return
	}
	a := h.g.auth
	a.mu.Lock()
	if h.live() {
		read(h.g)
	}
	a.mu.Unlock()
}

// Deadline returns the grant's deadline (zero: none).
func (h Grant) Deadline() time.Time {
	if !h.live() {
		return time.Time{}
	}
	if dl := h.g.dl.Load(); dl != nil {
		return dl.at
	}
	return time.Time{}
}

// Drawn returns the bytes drawn now.
func (h Grant) Drawn() memapi.Bytes {
	_, _, d := h.load()
	return d
}

// Remaining returns the bytes that can still be drawn (0 once closed).
func (h Grant) Remaining() memapi.Bytes {
	_, st, d := h.load()
	if st != stateOpen {
		return 0
	}
	return h.g.sz() - d
}

// Open reports whether the grant can still be drawn from and committed.
func (h Grant) Open() bool {
	_, st, _ := h.load()
	return st == stateOpen && !h.g.pastDeadline()
}

// load is the record's load for this handle: a zero Grant reads as
// stateUnissued, and a stale one as stateStale.
func (h Grant) load() (w, st uint64, d memapi.Bytes) {
	if h.g == nil {
		return 0, stateUnissued, 0
	}
	return h.g.loadAs(h.gen)
}

// loadAs is load for a handle of issue gen: stateStale when the record was
// issued again since. The issue is read after the word, and every issue
// bumps it before the record changes for its new holder (its fields, or
// its word without the lock, grant.reissue), so a word read as this
// issue's belongs to it. Everything it reads is atomic.
func (gr *grant) loadAs(gen uint64) (w, st uint64, d memapi.Bytes) {
	w, st, d = gr.load()
	if gr.issue.Load() != gen {
		return w, stateStale, 0
	}
	return w, st, d
}

// load returns the state word (to compare-and-swap from), and the state and
// drawn bytes of the grant's current issue: a word another era wrote belongs
// to the previous issue, closed before the grant was issued again, and reads
// as open with nothing drawn.
//
// Every record is issued before a handle of it exists.
func (gr *grant) load() (w, st uint64, d memapi.Bytes) {
	w = gr.state.Load()
	if w&eraBit != gr.sizeEra.Load()&eraBit {
		return w, stateOpen, 0
	}
	return w, w >> stateShift, memapi.Bytes(w & drawnMask)
}

// word is the state word of this issue in state st with d bytes drawn and
// no reissue left to book: for the swaps made under the lock, which book
// what w held (bookGen).
func (gr *grant) word(st uint64, d memapi.Bytes) uint64 {
	return st<<stateShift | gr.sizeEra.Load()&eraBit | uint64(d)
}

// keep is word(st, d) still counting w's reissues: for the swaps made
// without the lock.
func (gr *grant) keep(w, st uint64, d memapi.Bytes) uint64 {
	return gr.word(st, d) | gr.gen(w)<<genShift
}

// gen returns the reissues without the lock that w counts (none in a word
// of a previous issue: they were booked when it was issued again).
func (gr *grant) gen(w uint64) uint64 {
	if w&eraBit != gr.sizeEra.Load()&eraBit {
		return 0
	}
	return w & genMask >> genShift
}

// bookGen books in the authority's Granted the reissues w counted, once a
// swap under the lock replaced it by a word that counts none.
func (gr *grant) bookGen(a *authority, w uint64) { a.granted += gr.gen(w) }

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
//
// The issue count goes up before the swap: the handles of the last issue
// are stale from then on, whether the swap succeeds or the lock issues the
// grant (its use ended either way).
func (gr *grant) reissue() bool {
	w, st, _ := gr.load()
	if st != stateRefunded || gr.gen(w) == genMax {
		return false
	}
	gr.issue.Add(1)
	return gr.state.CompareAndSwap(w, gr.word(stateOpen, 0)|(gr.gen(w)+1)<<genShift)
}

// Draw takes n bytes from the grant. It fails with memapi.ErrGrantExhausted
// when fewer remain and with memapi.ErrGrantClosed once the grant was
// committed, cancelled or reclaimed after its deadline; then nothing changes.
func (h Grant) Draw(n memapi.Bytes) error {
	gr := h.g
	if h.zero() {
		return h.closed(opDraw)
	}
	if err := gr.inject(OpDraw, n); err != nil {
		return err
	}
	for {
		w, st, d := gr.loadAs(h.gen)
		if st == stateOpen && gr.pastDeadline() {
			gr.expire()
			continue
		}
		if st != stateOpen {
			return gr.closedError(opDraw, st)
		}
		if n > gr.sz()-d {
			return opError(opDraw, memapi.ErrGrantExhausted, gr.auth.id, n, gr.sz()-d, "")
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
func (h Grant) Undraw(n memapi.Bytes) error { return h.undraw(opUndraw, n) }

// Refund is Undraw: a refund to an open grant rolls back a commit made
// against it (memapi.Account).
func (h Grant) Refund(n memapi.Bytes) error { return h.undraw("governor.Grant.Refund", n) }

func (h Grant) undraw(op string, n memapi.Bytes) error {
	gr := h.g
	if h.zero() {
		return h.closed(op)
	}
	if err := gr.inject(OpUndraw, n); err != nil {
		return err
	}
	for {
		w, st, d := gr.loadAs(h.gen)
		if st != stateOpen && st != stateExpired {
			return gr.closedError(op, st)
		}
		if n > d {
			return opError(op, ErrOverReturn, gr.auth.id, n, d, "undraw beyond the drawn bytes")
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
func (h Grant) Commit() (Lease, error) {
	gr := h.g
	if h.zero() {
		return Lease{}, h.closed(opGrantCommit)
	}
	if err := gr.inject(OpCommit, 0); err != nil {
		return Lease{}, err
	}
	if w, st, d := gr.loadAs(h.gen); st == stateOpen && gr.dl.Load() == nil {
		// Every byte drawn and no timer to stop: no byte returns to free,
		// so no waiter can be served and the free figure does not move.
		// The commit is then this one compare-and-swap; the authority
		// settles the moves from reserved to charged under its lock before
		// anything reads them (authority.settleLocked).
		if d != 0 && d == gr.sz() && gr.state.CompareAndSwap(w, gr.keep(w, stateCommit, d)) {
			return Lease(h), nil
		}
	} else if st == stateOpen && gr.pastDeadline() {
		gr.expire()
	}
	a := gr.auth
	a.mu.Lock()
	d, ok := gr.transitionAs(h.gen, stateSettled)
	if !ok {
		_, st, _ := gr.loadAs(h.gen)
		a.mu.Unlock()
		return Lease{}, gr.closedError(opGrantCommit, st)
	}
	a.bookCommitLocked(gr, d)
	if d != gr.sz() {
		a.serveLocked()
	}
	a.mu.Unlock()
	return Lease(h), nil
}

// Cancel returns the whole grant to free. It fails with memapi.ErrInUse,
// changing nothing, while bytes are drawn: backing installed against the
// grant must be removed and undrawn (or refunded) first, so the ledger never
// forgets installed bytes. Cancelling a cancelled or expired grant with
// nothing drawn is a no-op; after Commit it fails with memapi.ErrGrantClosed.
func (h Grant) Cancel() error {
	gr := h.g
	if h.zero() {
		return h.closed(opGrantCancel)
	}
	if err := gr.inject(OpCancel, 0); err != nil {
		return err
	}
	a := gr.auth
	a.mu.Lock()
	for {
		w, st, d := gr.loadAs(h.gen)
		switch {
		case st == stateStale:
			a.mu.Unlock()
			return gr.closedError(opGrantCancel, st)
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
func (gr *grant) inject(op Op, n memapi.Bytes) error {
	if gr.inj == nil {
		return nil
	}
	return gr.inj.MaybeError(op, gr.auth.id, n)
}

// expire reclaims an open grant past its deadline: the undrawn bytes return
// to free; the drawn ones stay reserved until undrawn.
func (gr *grant) expire() { gr.expireBy(gr.auth, nil) }

// expireBy is expire for the deadline timer armed with dl on the grant's
// authority a: a timer that fires late, after the grant was closed and
// issued again (a spare grant), finds another deadline (or none) and leaves
// the new issue alone. It reads nothing of the grant before taking the lock.
func (gr *grant) expireBy(a *authority, dl *grantDeadline) {
	a.mu.Lock()
	if dl != nil && gr.dl.Load() != dl {
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
func (gr *grant) transition(st uint64) (memapi.Bytes, bool) {
	return gr.transitionAs(gr.issue.Load(), st)
}

// transitionAs is transition for a handle of issue gen: false for a stale
// one.
func (gr *grant) transitionAs(gen uint64, st uint64) (memapi.Bytes, bool) {
	for {
		w, cur, d := gr.loadAs(gen)
		if cur != stateOpen {
			return 0, false
		}
		if gr.state.CompareAndSwap(w, gr.word(st, d)) {
			gr.bookGen(gr.auth, w)
			return d, true
		}
	}
}

func (gr *grant) pastDeadline() bool {
	dl := gr.dl.Load()
	return dl != nil && !gr.auth.g.clock.Now().Before(dl.at)
}

// closed is the error of a method on a zero Grant (never reserved) or,
// for a Lease, on a stale one.
func (h Grant) closed(op string) error {
	if h.zero() {
		return opError(op, memapi.ErrGrantClosed, "", 0, 0, "never reserved")
	}
	return h.g.closedError(op, stateStale)
}

func (gr *grant) closedError(op string, st uint64) error {
	e := opError(op, memapi.ErrGrantClosed, gr.auth.id, 0, 0, "")
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
	case stateStale:
		e.Detail = "a stale handle: the grant was issued again since"
		e.Err = ErrStaleHandle
	}
	return e
}
