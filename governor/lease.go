package governor

import "github.com/memgen/memgen/generated/memapi"

// Lease is a holder's charge for committed memory, made by Grant.Commit. Its
// bytes are charged until the holder marks them pending (memory released but
// waiting for device fences) and refunded when the memory is really freed.
// It implements memapi.Account, so the checked wrappers refund to it.
//
// All methods are safe for concurrent use.
type Lease struct {
	g *Grant
	// guarded by the authority's mutex, and set when the commit is settled: every
	// method settles its own grant first (lockLease)
	charged     memapi.Bytes
	pending     memapi.Bytes
	quarantined memapi.Bytes // the part of charged whose free failed
}

var _ memapi.Account = (*Lease)(nil)

// Authority returns the authority the lease is charged on.
func (l *Lease) Authority() memapi.AuthorityID { return l.g.acct.a.id }

// Holder returns the holder the lease is charged to.
func (l *Lease) Holder() HolderID { return l.g.acct.h.id }

// Role returns what the memory was reserved for.
func (l *Lease) Role() Role { return l.g.role }

// lockLease takes the authority's mutex and settles the lease's commit if
// it was made without the lock.
func (l *Lease) lockLease() *authority {
	a := l.g.acct.a
	a.mu.Lock()
	a.settleGrantLocked(l.g)
	return a
}

// Charged returns the bytes charged and not pending.
func (l *Lease) Charged() memapi.Bytes {
	a := l.lockLease()
	defer a.mu.Unlock()
	return l.charged
}

// Pending returns the bytes waiting for fences before their free.
func (l *Lease) Pending() memapi.Bytes {
	a := l.lockLease()
	defer a.mu.Unlock()
	return l.pending
}

// Quarantined returns the part of the charged bytes whose free failed: the
// memory is still held by its mechanism, waiting for a retry.
func (l *Lease) Quarantined() memapi.Bytes {
	a := l.lockLease()
	defer a.mu.Unlock()
	return l.quarantined
}

// Bytes returns charged + pending: what the lease still holds.
func (l *Lease) Bytes() memapi.Bytes {
	a := l.lockLease()
	defer a.mu.Unlock()
	return l.charged + l.pending
}

// Refund returns n bytes whose memory was really freed: from pending first,
// then from charged. The bytes become free and waiting reservations are
// served. It fails with ErrOverReturn, changing nothing, beyond what the
// lease holds. A Refund that empties the lease ends its grant's use: the
// governor may issue both again (Reserve).
func (l *Lease) Refund(n memapi.Bytes) error {
	if err := l.g.inject(OpRefund, n); err != nil {
		return err
	}
	// refundUnsettled, spelled out on the hot path; with a reservation
	// waiting, the lock is taken anyway, so take it at once.
	if gr := l.g; n != 0 && !gr.acct.a.queued.Load() {
		if refundChecked != nil {
			refundChecked()
		}
		if w, st, d := gr.load(); st == stateCommit && d == n && gr.state.CompareAndSwap(w, gr.keep(w, stateRefunded, d)) {
			gr.refunded()
			gr.acct.a.putSpare(gr)
			return nil
		}
	}
	a := l.g.acct.a
	a.mu.Lock()
	if n != 0 && a.settleRefundLocked(l.g, n) {
		if a.head != nil {
			a.serveLocked()
		}
		a.mu.Unlock()
		a.putSpare(l.g)
		return nil
	}
	a.settleGrantLocked(l.g)
	if held := l.charged + l.pending; n > held {
		a.mu.Unlock()
		return opError("governor.Lease.Refund", ErrOverReturn, a.id, n, held, "refund beyond the lease")
	}
	emptied := l.refundLocked(n)
	a.mu.Unlock()
	if emptied {
		a.putSpare(l.g)
	}
	return nil
}

// refundChecked, when set (by tests, before anything runs concurrently),
// runs on Refund's lock-free path between its check that no reservation
// waits and its swap: a test queues a reservation there, the interleaving
// that only the wake after the swap (Grant.refunded) serves.
var refundChecked func()

// refundUnsettled refunds n bytes without the lock when they are the whole
// lease of a commit made without the lock and not settled since (so nothing
// else touched the lease): one compare-and-swap marks the grant refunded and
// the authority books it when it settles (authority.settleLocked). The
// bytes show as reserved, not free, until then, so a reservation that does
// not fit settles before it waits; and when one already waits, the refund
// settles and serves it at once. The refund checks for waiters after its
// swap and a reservation marks itself queued before it settles, so at
// least one of the two sees the other (both are sequentially consistent
// atomics): no waiter misses a refund. It reports false, changing nothing,
// when the lock is needed.
func (l *Lease) refundUnsettled(n memapi.Bytes) bool {
	gr := l.g
	w, st, d := gr.load()
	if st != stateCommit || d != n || !gr.state.CompareAndSwap(w, gr.keep(w, stateRefunded, d)) {
		return false
	}
	gr.refunded()
	gr.acct.a.putSpare(gr)
	return true
}

// refunded follows the swap that refunded gr's lease without the lock: a
// waiting reservation is served at once. It serves even when another
// settle booked the refund first (a snapshot, a reservation's), which does
// not serve.
func (gr *Grant) refunded() {
	if a := gr.acct.a; a.queued.Load() {
		a.mu.Lock()
		a.settleGrantLocked(gr)
		a.serveLocked()
		a.mu.Unlock()
	}
}

// refundLocked refunds n bytes of the lease and reports whether that
// emptied it, which ends its grant's use.
func (l *Lease) refundLocked(n memapi.Bytes) bool {
	if n == 0 {
		return false
	}
	c := l.g.acct
	a := c.a
	fromPending := min(n, l.pending)
	fromCharged := n - fromPending
	// Charged bytes not quarantined go first: quarantined ones are freed
	// by a retry, which refunds them with RefundQuarantined.
	if q := fromCharged - min(fromCharged, l.charged-l.quarantined); q != 0 {
		l.quarantined -= q
		a.quarantined -= q
		c.quar -= q
	}
	l.pending -= fromPending
	a.pending -= fromPending
	c.pending -= fromPending
	l.charged -= fromCharged
	a.charged -= fromCharged
	c.charged -= fromCharged
	emptied := l.charged == 0 && l.pending == 0
	if emptied {
		a.leases--
		c.leases--
	}
	if a.head != nil {
		a.serveLocked()
	}
	return emptied
}

// MarkPending moves n charged bytes to pending: the holder released the
// memory but its free waits for device fences. Refund them when it happens.
// It fails with ErrOverReturn, changing nothing, beyond the charged bytes.
// Quarantined bytes are not marked: their free already failed.
func (l *Lease) MarkPending(n memapi.Bytes) error {
	if err := l.g.inject(OpMarkPending, n); err != nil {
		return err
	}
	a, c := l.lockLease(), l.g.acct
	defer a.mu.Unlock()
	if n > l.charged-l.quarantined {
		return opError("governor.Lease.MarkPending", ErrOverReturn, a.id, n, l.charged-l.quarantined, "more than the charged bytes not quarantined")
	}
	l.charged -= n
	a.charged -= n
	c.charged -= n
	l.pending += n
	a.pending += n
	c.pending += n
	return nil
}

// Release refunds everything the lease still holds and returns how much that
// was. Releasing an empty lease is a no-op.
func (l *Lease) Release() memapi.Bytes {
	if _, st, d := l.g.load(); st == stateCommit && d != 0 && l.refundUnsettled(d) {
		return d
	}
	a := l.lockLease()
	n := l.charged + l.pending
	emptied := l.refundLocked(n)
	a.mu.Unlock()
	if emptied {
		a.putSpare(l.g)
	}
	return n
}

// Quarantine books n bytes of the lease whose free failed (pending ones
// first, then charged ones) as quarantined: charged again, since the memory
// is still held, and shown apart in snapshots (Quarantined), never asked
// for by a ticket. A retry that frees them refunds them with
// RefundQuarantined. It fails with ErrOverReturn, changing nothing, beyond
// the bytes not quarantined yet.
func (l *Lease) Quarantine(n memapi.Bytes) error {
	if err := l.g.inject(OpQuarantine, n); err != nil {
		return err
	}
	a, c := l.lockLease(), l.g.acct
	defer a.mu.Unlock()
	if free := l.pending + l.charged - l.quarantined; n > free {
		return opError("governor.Lease.Quarantine", ErrOverReturn, a.id, n, free, "more than the bytes not quarantined")
	}
	p := min(n, l.pending)
	l.pending -= p
	a.pending -= p
	c.pending -= p
	l.charged += p
	a.charged += p
	c.charged += p
	l.quarantined += n
	a.quarantined += n
	c.quar += n
	return nil
}

// RefundQuarantined returns n quarantined bytes that a retry really freed.
// It fails with ErrOverReturn, changing nothing, beyond the quarantined
// bytes.
func (l *Lease) RefundQuarantined(n memapi.Bytes) error {
	if err := l.g.inject(OpRefundQuarantined, n); err != nil {
		return err
	}
	a := l.lockLease()
	if n > l.quarantined {
		a.mu.Unlock()
		return opError("governor.Lease.RefundQuarantined", ErrOverReturn, a.id, n, l.quarantined, "more than the quarantined bytes")
	}
	// refundLocked takes pending first: refund from charged alone.
	c := l.g.acct
	l.quarantined -= n
	a.quarantined -= n
	c.quar -= n
	l.charged -= n
	a.charged -= n
	c.charged -= n
	emptied := l.charged == 0 && l.pending == 0 && n != 0
	if emptied {
		a.leases--
		c.leases--
	}
	if a.head != nil {
		a.serveLocked()
	}
	a.mu.Unlock()
	if emptied {
		a.putSpare(l.g)
	}
	return nil
}
