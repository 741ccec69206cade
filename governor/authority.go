package governor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// maxBytes bounds every figure so a grant's drawn bytes fit beside its state
// in one word (see grant.go).
const maxBytes memapi.Bytes = drawnMask

// pressureHistory is how many recent pressure events a snapshot shows per authority.
const pressureHistory = 32

// authority is one ledger. Every field below mu is guarded by it.
type authority struct {
	g  *Governor
	id memapi.AuthorityID

	mu   sync.Mutex
	shut error // non-nil once removed or closed: what new reservations get

	// queued mirrors head != nil for Lease.Refund, which reads it without
	// the lock after refunding without the lock (see refundUnsettled).
	queued atomic.Bool
	// closed mirrors shut != nil for Reserve, which drops a closed
	// authority it remembers (Governor.last) without the lock.
	closed atomic.Bool

	// hints are the grants Reserve issues again without the lock.
	hints hints

	admit        Admission // raises capacity for a reservation that does not fit (SetAdmission), or nil
	capacity     memapi.Bytes
	reserved     memapi.Bytes // open grant sizes + drawn bytes of expired grants
	charged      memapi.Bytes
	pending      memapi.Bytes
	expiredDrawn memapi.Bytes // the part of reserved held by expired grants
	quarantined  memapi.Bytes // the part of charged whose free failed (Lease.Quarantine)
	asking       memapi.Bytes // bytes asked by tickets whose Reclaim has not returned

	head, tail   *waiter
	waiters      int
	waitingBytes memapi.Bytes

	// spares lists (snext) the grants whose use ended under the lock
	// (cancelled, their lease emptied, or refunded whole and settled),
	// which an issue under the lock takes before it makes a new one.
	spares  *grant
	nspares int

	accts     map[HolderID]*account
	timed     grantList // open grants with a running deadline timer
	unsettled *grant    // list (uprev/unext) of grants whose figures may still move: open, or committed without the lock
	linked    int       // grants in unsettled
	settleAt  int       // settle when linked reaches it, so refunded grants do not pile up

	grants int // open grants
	leases int // leases with bytes

	granted, waited, overBudget, cancelled, expired uint64
	tickets, pressureEvents                         uint64
	freed                                           memapi.Bytes
	recent                                          [pressureHistory]PressureEvent
}

// waiter is a reservation queued for bytes. Its fields are guarded by the
// authority's mutex until ready is closed; after that they are the waiter's.
type waiter struct {
	acct       *account
	bytes      memapi.Bytes
	role       Role
	priority   Priority
	deadline   time.Time
	ready      chan struct{} // closed when served (grant set) or failed (err set)
	grant      *grant
	err        error
	pressure   uint64 // its pressure event's number, 0 if none
	prev, next *waiter
}

func (a *authority) usedLocked() memapi.Bytes { return a.reserved + a.charged + a.pending }

func (a *authority) freeLocked() memapi.Bytes { return a.capacity - a.usedLocked() }

func (a *authority) pushLocked(w *waiter) {
	if a.head == nil {
		a.queued.Store(true)
	}
	w.prev = a.tail
	if a.tail != nil {
		a.tail.next = w
	} else {
		a.head = w
	}
	a.tail = w
	a.waiters++
	a.waitingBytes += w.bytes
	w.acct.waiting += w.bytes
}

func (a *authority) removeLocked(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		a.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		a.tail = w.prev
	}
	if a.head == nil {
		a.queued.Store(false)
	}
	w.prev, w.next = nil, nil
	a.waiters--
	a.waitingBytes -= w.bytes
	w.acct.waiting -= w.bytes
}

// serveLocked grants queued reservations in arrival order while the one at
// the head fits. It stops at the first that does not: a later, smaller
// request never overtakes an earlier one.
func (a *authority) serveLocked() {
	for w := a.head; w != nil; w = a.head {
		if a.freeLocked() < w.bytes {
			return
		}
		a.removeLocked(w)
		w.grant = a.newGrantLocked(w.acct, w.role, w.bytes, w.priority, w.deadline)
		close(w.ready)
	}
}

// shutLocked fails every waiter with err, stops deadline timers and refuses
// new reservations.
func (a *authority) shutLocked(err error) {
	a.shut = err
	a.closed.Store(true)
	// No grant is issued again without the lock from now on. The slot is
	// closed before the settle: a grant the settle reads committed without
	// the lock is settled by it (so its refund takes the lock), and one it
	// reads open is committed after it, so its refund, later still, finds
	// the slot closed and takes the lock (Lease.refundUnsettled). So no
	// refunded grant is left in the slot or the pool after Close.
	a.hints.close()
	a.settleLocked()
	for w := a.head; w != nil; w = a.head {
		a.removeLocked(w)
		w.err = err
		close(w.ready)
	}
	for gr := a.timed.head; gr != nil; gr = a.timed.head {
		a.timed.remove(gr)
		gr.dl.Load().timer.Stop()
		gr.dl.Load().timer = nil
	}
}

// newGrantLocked books an open grant of size bytes for c, in a spare
// record (retireLocked) or a new one.
func (a *authority) newGrantLocked(c *account, role Role, size memapi.Bytes, pri Priority, deadline time.Time) *grant {
	gr := a.spareLocked()
	if gr == nil {
		gr = &grant{auth: a, inj: a.g.inject}
	}
	// A new epoch makes the handles of the last issue stale before
	// anything of the record changes (grant.loadAs). The issues made
	// without the lock in the last one are booked first.
	gr.book(a, gr.state.Load())
	gr.epoch.Add(1)
	gr.booked = 0
	gr.acct, gr.holder, gr.role, gr.priority = c, c.h.id, role, pri
	gr.dl.Store(nil)
	gr.lease = leaseFigures{}
	gr.size.Store(uint64(size))
	w := stateOpen << stateShift
	if !deadline.IsZero() || gr.inj != nil {
		w |= slowBit
	}
	gr.state.Store(w)
	if a.linked >= a.settleAt {
		a.settleLocked()
		a.settleAt = 2*a.linked + 64
	}
	gr.unext = a.unsettled
	if a.unsettled != nil {
		a.unsettled.uprev = gr
	}
	a.unsettled = gr
	a.linked++
	a.reserved += size
	c.reserved += size
	a.grants++
	c.grants++
	a.granted++
	if !deadline.IsZero() {
		// The clock never calls the function before AfterFunc returns, so
		// scheduling under the lock is safe. The closure names this
		// deadline, so a timer that fires after the grant was reused
		// finds another and does nothing.
		dl := &grantDeadline{at: deadline}
		gr.dl.Store(dl)
		dl.timer = a.g.clock.AfterFunc(deadline.Sub(a.g.clock.Now()), func() { gr.expireBy(a, dl) })
		a.timed.push(gr)
	}
	return gr
}

// closeGrantLocked forgets an open grant's booking (the caller moves its bytes).
func (a *authority) closeGrantLocked(gr *grant) {
	a.grants--
	gr.acct.grants--
	if gr.uprev != nil {
		gr.uprev.unext = gr.unext
	} else {
		a.unsettled = gr.unext
	}
	if gr.unext != nil {
		gr.unext.uprev = gr.uprev
	}
	gr.uprev, gr.unext = nil, nil
	a.linked--
	if gr.dl.Load() != nil && gr.dl.Load().timer != nil {
		a.timed.remove(gr)
		gr.dl.Load().timer.Stop()
		gr.dl.Load().timer = nil
	}
}

// bookCommitLocked books the commit of gr with d bytes drawn: the grant's
// size leaves reserved and d becomes its lease's charge.
func (a *authority) bookCommitLocked(gr *grant, d memapi.Bytes) {
	c := gr.acct
	a.closeGrantLocked(gr)
	a.reserved -= gr.sz()
	c.reserved -= gr.sz()
	a.charged += d
	c.charged += d
	gr.lease.charged = d
	if d != 0 {
		a.leases++
		c.leases++
	}
}

// unsettledLocked reports whether gr is in the unsettled list: open, or
// closed without the lock and not yet booked.
func (a *authority) unsettledLocked(gr *grant) bool {
	return gr.uprev != nil || a.unsettled == gr
}

// settleLocked books what was done without the lock: the commits of fully
// drawn grants (Grant.Commit then only swaps the grant's state) and the
// whole refunds of their leases made before anything else touched them
// (Lease.Refund then only swaps it again). Until then their bytes count in
// reserved: the sum reserved + charged is right for an unsettled commit,
// and for an unsettled refund the figures show fewer free bytes than there
// are, never more. So every reader of the split, of the counts or of a
// lease's figures settles first (snapshots, tickets and their reclaimable
// bytes, over-budget figures, lease methods, Unregister, RemoveAuthority,
// SetCapacity), a reservation that does not fit settles before it fails or
// waits, and a refund made while a reservation waits settles at once. It
// reports whether refunds were booked (free bytes grew).
func (a *authority) settleLocked() bool {
	freed := false
	for gr := a.unsettled; gr != nil; {
		next := gr.unext
		freed = a.settleGrantLocked(gr) || freed
		gr = next
	}
	return freed
}

// settleGrantLocked settles gr alone (a lease's own figures) and reports
// whether it booked a refund (which retired gr). Every swap here races with
// those made without the lock, hence the retries.
func (a *authority) settleGrantLocked(gr *grant) bool {
	if !a.unsettledLocked(gr) {
		return false
	}
	for {
		w, st, d := gr.load()
		switch st {
		case stateOpen:
			// Issued again without the lock: booked, the word unchanged.
			gr.book(a, w)
		case stateCommit:
			if !gr.state.CompareAndSwap(w, with(w, stateSettled, d)) {
				continue
			}
			gr.book(a, w)
			a.bookCommitLocked(gr, d)
		case stateRefunded:
			// Settled with its lease empty: no longer reissued without
			// the lock (Grant.reissue), and spare.
			if !gr.state.CompareAndSwap(w, with(w, stateSettled, d)) {
				continue
			}
			gr.book(a, w)
			a.dropGrantLocked(gr)
			a.retireLocked(gr)
			return true
		}
		return false
	}
}

// settleRefundLocked is Lease.Refund of all n bytes of an unsettled commit
// under the lock: settled as refunded whole in one swap, rather than booked
// charged and then refunded, and the grant retired. It reports false,
// changing nothing, when that is not the case.
func (a *authority) settleRefundLocked(gr *grant, n memapi.Bytes) bool {
	if !a.unsettledLocked(gr) {
		return false
	}
	w, st, d := gr.load()
	if st != stateCommit || d != n || !gr.state.CompareAndSwap(w, with(w, stateSettled, d)) {
		return false
	}
	gr.book(a, w)
	a.dropGrantLocked(gr)
	a.retireLocked(gr)
	return true
}

// maxSpares bounds an authority's spare list: more grants than that ended
// at once are left to the garbage collector.
const maxSpares = 1024

// spareLocked takes a grant whose use ended for an issue under the lock:
// from the spare list, or else a hint whose lease was refunded whole (which
// its settle retires), or nil when there is none.
func (a *authority) spareLocked() *grant {
	if a.spares == nil {
		if h := a.hints.refunded(); h == nil || !a.settleGrantLocked(h) {
			if h, _ := a.hints.pool.Get().(*grant); h == nil || !a.settleGrantLocked(h) {
				return nil
			}
		}
	}
	gr := a.spares
	a.spares, gr.snext = gr.snext, nil
	a.nspares--
	return gr
}

// retireLocked keeps gr, whose use just ended under the lock (cancelled,
// its lease emptied, or refunded whole and settled), for a later issue
// under the lock (newGrantLocked), and takes it out of the hints: nothing
// issues it again without the lock from now on (its word is not refunded
// any more). Each use ends once, so no grant is listed twice.
func (a *authority) retireLocked(gr *grant) {
	a.hints.drop(gr)
	if a.nspares < maxSpares {
		gr.snext = a.spares
		a.spares = gr
		a.nspares++
	}
}

// unclaimLocked gives back gr, which a reservation issued again without the
// lock (grant.reissue, word w) for a request its holder, role or priority
// do not match: the issue never left the reservation, so it is not booked
// as one, and the record is what it was before, a grant whose lease was
// refunded whole, now settled and retired.
func (a *authority) unclaimLocked(gr *grant, w uint64) {
	// The issues before it are booked; a settle since may have booked it
	// too, and then this takes it back (unsigned arithmetic wraps).
	a.granted += wordGen(w) - 1 - gr.booked
	gr.booked = wordGen(w)
	gr.state.Store(with(w, stateSettled, gr.sz()))
	a.dropGrantLocked(gr)
	a.retireLocked(gr)
}

// dropGrantLocked returns a committed grant whose lease was refunded whole
// before it was settled: its size leaves reserved for free.
func (a *authority) dropGrantLocked(gr *grant) {
	c := gr.acct
	a.closeGrantLocked(gr)
	a.reserved -= gr.sz()
	c.reserved -= gr.sz()
}

// reclaimableLocked sums what tickets could still ask for. The caller
// settled first: a figure read after a second settle could disagree with
// one read before it.
func (a *authority) reclaimableLocked() memapi.Bytes {
	var r memapi.Bytes
	for _, c := range a.accts {
		r += c.reclaimable()
	}
	return r
}

// overBudgetLocked describes why w cannot be served, with the figures now;
// ahead is the bytes queued before it.
func (a *authority) overBudgetLocked(w *waiter, ahead memapi.Bytes, reason string, cause error) *OverBudgetError {
	a.settleLocked()
	e := &OverBudgetError{
		Op:          "governor.Reserve",
		Kind:        memapi.ErrOverBudget,
		Authority:   a.id,
		Holder:      w.acct.h.id,
		Reason:      reason,
		Wanted:      w.bytes,
		Free:        a.freeLocked(),
		Reclaimable: a.reclaimableLocked(),
		Pending:     a.pending,
		Reserved:    a.reserved,
		Charged:     a.charged,
		Capacity:    a.capacity,
		Waiting:     ahead,
		Err:         cause,
	}
	a.overBudget++
	return e
}

// aheadLocked sums the bytes queued before w (w must be queued).
func (a *authority) aheadLocked(w *waiter) memapi.Bytes {
	var n memapi.Bytes
	for x := a.head; x != nil && x != w; x = x.next {
		n += x.bytes
	}
	return n
}

// grantList is an intrusive list of grants.
type grantList struct{ head *grant }

// Its members all have a deadline (gr.dl.Load() != nil).
func (l *grantList) push(gr *grant) {
	gr.dl.Load().tnext = l.head
	if l.head != nil {
		l.head.dl.Load().tprev = gr
	}
	l.head = gr
}

func (l *grantList) remove(gr *grant) {
	d := gr.dl.Load()
	if d.tprev != nil {
		d.tprev.dl.Load().tnext = d.tnext
	} else {
		l.head = d.tnext
	}
	if d.tnext != nil {
		d.tnext.dl.Load().tprev = d.tprev
	}
	d.tprev, d.tnext = nil, nil
}
