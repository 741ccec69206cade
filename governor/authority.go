package governor

import (
	"sync"
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

	capacity     memapi.Bytes
	reserved     memapi.Bytes // open grant sizes + drawn bytes of expired grants
	charged      memapi.Bytes
	pending      memapi.Bytes
	expiredDrawn memapi.Bytes // the part of reserved held by expired grants
	asking       memapi.Bytes // bytes asked by tickets whose Reclaim has not returned

	head, tail   *waiter
	waiters      int
	waitingBytes memapi.Bytes

	accts map[HolderID]*account
	timed grantList // open grants with a running deadline timer

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
	grant      *Grant
	err        error
	pressure   uint64 // its pressure event's number, 0 if none
	prev, next *waiter
}

func (a *authority) usedLocked() memapi.Bytes { return a.reserved + a.charged + a.pending }

func (a *authority) freeLocked() memapi.Bytes { return a.capacity - a.usedLocked() }

func (a *authority) pushLocked(w *waiter) {
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
	for w := a.head; w != nil; w = a.head {
		a.removeLocked(w)
		w.err = err
		close(w.ready)
	}
	for gr := a.timed.head; gr != nil; gr = a.timed.head {
		a.timed.remove(gr)
		gr.dl.timer.Stop()
		gr.dl.timer = nil
	}
}

// newGrantLocked books an open grant of size bytes for c.
func (a *authority) newGrantLocked(c *account, role Role, size memapi.Bytes, pri Priority, deadline time.Time) *Grant {
	gr := &Grant{auth: a, acct: c, role: role, size: size, priority: pri}
	gr.lease.g = gr
	a.reserved += size
	c.reserved += size
	a.grants++
	c.grants++
	a.granted++
	if !deadline.IsZero() {
		// The clock never calls the function before AfterFunc returns, so
		// scheduling under the lock is safe.
		gr.dl = &grantDeadline{at: deadline}
		gr.dl.timer = a.g.clock.AfterFunc(deadline.Sub(a.g.clock.Now()), gr.expire)
		a.timed.push(gr)
	}
	return gr
}

// closeGrantLocked forgets an open grant's booking (the caller moves its bytes).
func (a *authority) closeGrantLocked(gr *Grant) {
	a.grants--
	gr.acct.grants--
	if gr.dl != nil && gr.dl.timer != nil {
		a.timed.remove(gr)
		gr.dl.timer.Stop()
		gr.dl.timer = nil
	}
}

// reclaimableLocked sums what tickets could still ask for.
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
type grantList struct{ head *Grant }

// Its members all have a deadline (gr.dl != nil).
func (l *grantList) push(gr *Grant) {
	gr.dl.tnext = l.head
	if l.head != nil {
		l.head.dl.tprev = gr
	}
	l.head = gr
}

func (l *grantList) remove(gr *Grant) {
	d := gr.dl
	if d.tprev != nil {
		d.tprev.dl.tnext = d.tnext
	} else {
		l.head = d.tnext
	}
	if d.tnext != nil {
		d.tnext.dl.tprev = d.tprev
	}
	d.tprev, d.tnext = nil, nil
}
