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
// The word also counts the issues made without the lock since the record
// was last issued under it (Reserve of a grant whose lease was just
// refunded whole, grant.reissue): its generation within the record's
// epoch, which an issue under the lock bumps. A handle names both (see
// Grant), so every compare-and-swap a handle makes on the word also checks
// that the handle's issue is the current one. The authority books the
// issues made without the lock in Granted when it next holds the lock
// (grant.book). At genMax the next issue takes the lock.
//
// Between the state and the generation, the slow bit says the issue has a
// deadline or the governor an Injector: the methods' few-instruction paths
// then step aside (they compare the state, the slow bit and the generation
// as one number, the word's tag above genShift).
const (
	stateShift           = 61
	slowShift            = 60
	genShift             = 52
	tagState             = stateShift - genShift // the state's place in the tag
	genBits              = slowShift - genShift
	genMax               = 1<<genBits - 1
	genMask              = genMax << genShift
	slowBit              = 1 << slowShift
	drawnMask            = 1<<genShift - 1
	stateMask     uint64 = 7 << stateShift
	stateOpen     uint64 = 0
	stateCommit   uint64 = 1 // committed without the lock, not settled yet (authority.settleLocked)
	stateCancel   uint64 = 2
	stateExpired  uint64 = 3
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
	g *grant
	// gen is the issue of g this handle was made for: the record's epoch
	// above genBits, the word's generation below (grant.genAt).
	gen uint64
}

// grant is the governor's record behind a Grant and its Lease, recycled
// from one issue to the next.
//
// Its holder, role and priority are written only by an issue under the
// authority's lock, of a record nobody else can issue (a new one, or one
// taken from the authority's spare list), before any handle of the issue
// exists. They are read under that lock, or without it by the reservation
// that just issued the record again without the lock (its swap made the
// record its own).
type grant struct {
	// What the methods' fast paths read comes first, in one cache line.
	state atomic.Uint64
	// epoch counts the issues of the record under the lock: bumped before
	// such an issue writes anything else, so a handle of an earlier one
	// fails (loadAs).
	epoch atomic.Uint64
	size  atomic.Uint64                 // written by an issue under the lock; stale handles read it
	dl    atomic.Pointer[grantDeadline] // nil without a deadline, which keeps the record small
	// auth and inj are set when the record is made, before its first
	// issue, and never change: a stale handle reads them without the lock.
	auth     *authority
	inj      Injector // the governor's Options.Injector, or nil
	acct     *account // the holder's account of this issue
	holder   HolderID // acct's holder, beside the role for Reserve's comparison
	role     Role
	priority Priority

	// guarded by the authority's mutex:
	booked       uint64 // the issues without the lock in this epoch booked in Granted (grant.book)
	uprev, unext *grant // the grant's place in its list of unsettled grants (see authority.settleLocked)
	snext        *grant // the next grant in the authority's spare list (authority.retireLocked)

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

// handle is the Grant of gr's current issue, whose word is w: called by
// the issuer, before any other handle of the issue exists.
func (gr *grant) handle(w uint64) Grant { return Grant{g: gr, gen: gr.genAt(w)} }

// genAt is the generation a handle of the issue that wrote w carries: the
// epoch, read after w (see loadAs), and w's generation within it.
func (gr *grant) genAt(w uint64) uint64 { return gr.epoch.Load()<<genBits | wordGen(w) }

// wordGen is the generation w counts within the record's epoch.
func wordGen(w uint64) uint64 { return w & genMask >> genShift }

// live reports whether h names the current issue of its record (for the
// getters; the methods that change the record check the issue where they
// read the state word, grant.loadAs).
func (h Grant) live() bool {
	if h.zero() {
		return false
	}
	_, st, _ := h.g.loadAs(h.gen)
	return st != stateStale
}

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
	h.issued(func(gr *grant) { id = gr.holder })
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

// sz is the size of the record's current issue.
func (gr *grant) sz() memapi.Bytes { return memapi.Bytes(gr.size.Load()) }

// Priority returns the priority the grant was reserved with.
func (h Grant) Priority() Priority {
	var p Priority
	h.issued(func(gr *grant) { p = gr.priority })
	return p
}

// issued calls read with h's record under the authority's lock when h
// names the record's current issue. The holder, role and priority of a
// record change only under that lock, at its next issue (newGrantLocked),
// so a stale handle's getter never reads them while they are written: it
// reads the zero value instead.
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
// issued again since, whether under the lock (another epoch) or without it
// (another generation in the word). The epoch is read after the word, and
// an issue under the lock bumps it before it writes the word (or anything
// else), so a word read with the handle's epoch and generation belongs to
// the handle's issue, and a swap from it fails if the record was issued
// again since. Everything it reads is atomic.
func (gr *grant) loadAs(gen uint64) (w, st uint64, d memapi.Bytes) {
	w, st, d = gr.load()
	if wordGen(w) != gen&genMax || gr.epoch.Load() != gen>>genBits {
		return w, stateStale, 0
	}
	return w, st, d
}

// load returns the state word (to compare-and-swap from), and the state and
// drawn bytes of the grant's current issue.
func (gr *grant) load() (w, st uint64, d memapi.Bytes) {
	w = gr.state.Load()
	return w, w >> stateShift, memapi.Bytes(w & drawnMask)
}

// with is w in state st with d bytes drawn, in the same issue: every swap
// of the word but an issue keeps its generation and slow bit.
func with(w, st uint64, d memapi.Bytes) uint64 {
	return st<<stateShift | w&(slowBit|genMask) | uint64(d)
}

// book books in the authority's Granted the issues without the lock that w
// counts and that were not booked yet. Called with the authority's mutex
// held, by whatever holds it and reads the word: a settle, a swap under
// the lock, an issue under the lock (before it starts a new epoch).
func (gr *grant) book(a *authority, w uint64) {
	a.granted += wordGen(w) - gr.booked
	gr.booked = wordGen(w)
}

// reissue issues again, without the lock, a grant whose lease was refunded
// whole and not settled since: its size stays reserved all along, so
// nothing in the ledger moves; the word swaps from refunded back to open,
// one generation on, which makes the handles of the last issue stale and
// the record the caller's. It returns the new word, or false when the
// swap failed (another reservation took the record, or a settle booked
// the refund) or the generation is at genMax; then nothing changed.
//
// The holder, role and priority stay the last issue's: the caller compares
// them with its request after the swap, when nothing can write them, and
// gives the record back under the lock if they differ
// (authority.unclaimLocked). The size is the word's drawn bytes, which a
// refunded word holds whole, so the caller compares it before.
//
// Any settle turns a refunded grant to settled first (Unregister,
// RemoveAuthority, SetCapacity and a reservation that waits or fails all
// settle), so the swap fails, changing nothing, once the reservation would
// need the lock: to wait its turn, to fail, or to book. After Close no
// refunded grant is left where a reservation looks (hints.close).
func (gr *grant) reissue(w uint64) (uint64, bool) {
	// Refunded, not slow, and a generation below genMax, in one
	// comparison.
	if w>>genShift-stateRefunded<<tagState >= genMax {
		return 0, false
	}
	next := w&genMask + 1<<genShift // open, nothing drawn
	return next, gr.state.CompareAndSwap(w, next)
}

// Draw takes n bytes from the grant. It fails with memapi.ErrGrantExhausted
// when fewer remain and with memapi.ErrGrantClosed once the grant was
// committed, cancelled or reclaimed after its deadline; then nothing changes.
func (h Grant) Draw(n memapi.Bytes) error {
	// The common case in few instructions: an open grant with no deadline
	// and no injector, drawn in one swap.
	gr := h.g
	if gr == nil {
		return h.draw(n)
	}
	// Open (state 0), not slow (no deadline, no injector), in this
	// handle's generation and epoch, and n bytes (not 0) left.
	w := gr.state.Load()
	if w>>genShift != h.gen&genMax || gr.epoch.Load() != h.gen>>genBits || uint64(n)-1 >= gr.size.Load()-w&drawnMask ||
		!gr.state.CompareAndSwap(w, w+uint64(n)) {
		return h.draw(n)
	}
	return nil
}

// draw is Draw in every case.
func (h Grant) draw(n memapi.Bytes) error {
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
		if n == 0 || gr.state.CompareAndSwap(w, with(w, stateOpen, d+n)) {
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
		if !gr.state.CompareAndSwap(w, with(w, st, d-n)) {
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
	// Every byte drawn, no timer to stop and no injector: no byte returns
	// to free, so no waiter can be served and the free figure does not
	// move. The commit is then this one compare-and-swap; the authority
	// settles the moves from reserved to charged under its lock before
	// anything reads them (authority.settleLocked).
	gr := h.g
	if gr == nil {
		return h.commit()
	}
	// Open (state 0), not slow (no deadline, no injector), in this
	// handle's generation and epoch, every byte drawn.
	w := gr.state.Load()
	if w>>genShift != h.gen&genMax || gr.epoch.Load() != h.gen>>genBits || w&drawnMask != gr.size.Load() ||
		!gr.state.CompareAndSwap(w, w|stateCommit<<stateShift) {
		return h.commit()
	}
	return Lease(h), nil
}

// commit is Commit in every case.
func (h Grant) commit() (Lease, error) {
	gr := h.g
	if h.zero() {
		return Lease{}, h.closed(opGrantCommit)
	}
	if err := gr.inject(OpCommit, 0); err != nil {
		return Lease{}, err
	}
	if w, st, d := gr.loadAs(h.gen); st == stateOpen && gr.dl.Load() == nil {
		if d != 0 && d == gr.sz() && gr.state.CompareAndSwap(w, with(w, stateCommit, d)) {
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
		case d != 0:
			a.mu.Unlock()
			return opError(opGrantCancel, memapi.ErrInUse, a.id, d, 0, "bytes still drawn: remove the backing and undraw first")
		case st != stateOpen:
			a.mu.Unlock()
			return nil
		}
		if gr.state.CompareAndSwap(w, with(w, stateCancel, 0)) {
			gr.book(a, w)
			break
		}
	}
	a.closeGrantLocked(gr)
	a.reserved -= gr.sz()
	gr.acct.reserved -= gr.sz()
	a.retireLocked(gr)
	a.serveLocked()
	a.mu.Unlock()
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
	holder, role := gr.holder, gr.role
	a.mu.Unlock()
	a.g.log.Debug("governor: grant expired", "authority", a.id, "holder", holder, "role", role, "returned", back, "drawn", d)
	a.g.emit(Event{Kind: EventGrantExpired, Authority: a.id, Holder: holder, Role: role, Bytes: back, Drawn: d})
}

// transition moves an open grant to st and returns the bytes drawn at that
// instant. Called with the authority's mutex held.
func (gr *grant) transition(st uint64) (memapi.Bytes, bool) {
	// Only an open word can move, and nothing issues an open record
	// again, so its own generation names the current issue.
	return gr.transitionAs(gr.genAt(gr.state.Load()), st)
}

// transitionAs is transition for a handle of issue gen: false for a stale
// one.
func (gr *grant) transitionAs(gen uint64, st uint64) (memapi.Bytes, bool) {
	for {
		w, cur, d := gr.loadAs(gen)
		if cur != stateOpen {
			return 0, false
		}
		if gr.state.CompareAndSwap(w, with(w, st, d)) {
			gr.book(gr.auth, w)
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
	case stateUnissued:
		e.Detail = "never reserved"
	case stateStale:
		e.Detail = "a stale handle: the grant was issued again since"
		e.Err = ErrStaleHandle
	}
	return e
}
