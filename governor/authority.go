package governor

import (
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// maxBytes bounds every figure (and a reservation), far above any memory,
// so sums of figures never overflow.
const maxBytes memapi.Bytes = 1<<52 - 1

// authority is one ledger. Every field below mu is guarded by it.
type authority struct {
	g  *Governor
	id memapi.AuthorityID

	mu   sync.Mutex
	shut error // non-nil once removed or closed: what new reservations get

	admit    Admission // raises capacity for a reservation that does not fit (SetAdmission), or nil
	capacity memapi.Bytes
	fig      figures
	asking   memapi.Bytes // bytes asked by tickets whose Reclaim has not returned

	head, tail   *waiter
	waiters      int
	waitingBytes memapi.Bytes

	accts map[HolderID]*account
	timed map[*grant]struct{} // open grants with a running deadline timer

	granted, waited, overBudget, cancelled, expired uint64
	tickets, pressureEvents                         uint64
	freed                                           memapi.Bytes
}

// waiter is a reservation queued for bytes. Its fields are guarded by the
// authority's mutex until ready is closed; after that they are the waiter's.
type waiter struct {
	acct       *account
	bytes      memapi.Bytes
	role       string
	priority   int
	deadline   time.Time
	ready      chan struct{} // closed when served (grant set) or failed (err set)
	grant      *grant
	err        error
	prev, next *waiter
}

func (a *authority) freeLocked() memapi.Bytes { return a.capacity - a.fig.used() }

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

// serve grants queued reservations in arrival order while the one at the
// head fits. It stops at the first that does not: a later, smaller request
// never overtakes an earlier one.
func (a *authority) serve() {
	for w := a.head; w != nil; w = a.head {
		if a.freeLocked() < w.bytes {
			return
		}
		a.removeLocked(w)
		w.grant = a.reserve(&grant{a: a, size: w.bytes}, w.acct, w.role, w.deadline)
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
	for gr := range a.timed {
		gr.dl.timer()
		gr.dl.timer = nil
		delete(a.timed, gr)
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
		Pending:     a.fig.pending,
		Reserved:    a.fig.reserved,
		Charged:     a.fig.charged,
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
