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
	// closed mirrors shut != nil for Reserve, which reissues a spare grant
	// without the lock (see Grant.reissue).
	closed atomic.Bool

	// spare holds grants whose use ended (cancelled, or committed and
	// their lease refunded whole), which Reserve issues again (putSpare).
	spare sync.Pool

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
	into       *grant        // a spare grant to fill (Reserve), or nil
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
		w.grant = a.newGrantLocked(w.acct, w.role, w.bytes, w.priority, w.deadline, w.into)
		close(w.ready)
	}
}

// shutLocked fails every waiter with err, stops deadline timers and refuses
// new reservations.
func (a *authority) shutLocked(err error) {
	a.shut = err
	a.closed.Store(true)
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

// newGrantLocked books an open grant of size bytes for c, in gr (a spare
// one, checked reusable) or in a new one when gr is nil.
func (a *authority) newGrantLocked(c *account, role Role, size memapi.Bytes, pri Priority, deadline time.Time, gr *grant) *grant {
	relink := true
	switch {
	case gr == nil:
		gr = &grant{auth: a, inj: a.g.inject}
	case a.unsettledLocked(gr):
		// Refunded whole without the lock and issued again at once (a
		// spare grant, see reusableLocked): its old booking
		// goes, its place in the list stays.
		gr.bookGen(a, gr.state.Load())
		old := gr.acct
		a.reserved -= gr.sz()
		old.reserved -= gr.sz()
		a.grants--
		old.grants--
		relink = false
	}
	// A new issue makes the handles of the last one stale before anything
	// of the record changes (grant.loadAs).
	gr.issue.Add(1)
	gr.acct, gr.role, gr.priority = c, role, pri
	gr.dl.Store(nil)
	gr.lease = leaseFigures{}
	// A new issue flips the era: the closed word of the last one reads as
	// open (grant.load) to the handles of this issue only.
	gr.sizeEra.Store((gr.sizeEra.Load()&eraBit ^ eraBit) | uint64(size))
	if relink {
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
	}
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
// whether it booked a refund. Every swap here races with those made
// without the lock, hence the retries.
func (a *authority) settleGrantLocked(gr *grant) bool {
	if !a.unsettledLocked(gr) {
		return false
	}
	for {
		w, st, d := gr.load()
		switch st {
		case stateOpen:
			if gr.gen(w) == 0 {
				return false
			}
			if !gr.state.CompareAndSwap(w, gr.word(stateOpen, d)) {
				continue
			}
			gr.bookGen(a, w)
		case stateCommit:
			if !gr.state.CompareAndSwap(w, gr.word(stateSettled, d)) {
				continue
			}
			gr.bookGen(a, w)
			a.bookCommitLocked(gr, d)
		case stateRefunded:
			// Settled with its lease empty: no longer reissued without
			// the lock (Grant.reissue).
			if !gr.state.CompareAndSwap(w, gr.word(stateSettled, d)) {
				continue
			}
			gr.bookGen(a, w)
			a.dropGrantLocked(gr)
			return true
		}
		return false
	}
}

// settleRefundLocked is Lease.Refund of all n bytes of an unsettled commit
// under the lock: settled as refunded whole in one swap, rather than booked
// charged and then refunded. It reports false, changing nothing, when that
// is not the case.
func (a *authority) settleRefundLocked(gr *grant, n memapi.Bytes) bool {
	if !a.unsettledLocked(gr) {
		return false
	}
	w, st, d := gr.load()
	if st != stateCommit || d != n || !gr.state.CompareAndSwap(w, gr.word(stateSettled, d)) {
		return false
	}
	gr.bookGen(a, w)
	a.dropGrantLocked(gr)
	return true
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
