package governor

import "github.com/memgen/memgen/generated/memapi"

// Lease is a holder's charge for committed memory, made by Grant.Commit. Its
// bytes are charged until the holder marks them pending (memory released but
// waiting for device fences) and refunded when the memory is really freed.
// It implements memapi.Account, so the checked wrappers refund to it.
//
// Like a Grant, a Lease is a handle on the governor's record of its grant,
// for one issue of it: once the lease was emptied (Refund, Release,
// RefundQuarantined) the record may be issued again, and from then on every
// method of the old Lease changes nothing: the figures read 0, Release
// returns 0, and the others fail with memapi.ErrGrantClosed caused by
// ErrStaleHandle. A copy of a Lease is the same handle.
//
// All methods are safe for concurrent use.
type Lease struct {
	g   *grant
	gen uint64 // the issue of g the lease was committed in (see Grant)
}

// leaseFigures are a lease's figures, kept in its grant's record: guarded
// by the authority's mutex, and set when the commit is settled (every
// method settles its own grant first, lockLease).
type leaseFigures struct {
	charged     memapi.Bytes
	pending     memapi.Bytes
	quarantined memapi.Bytes // the part of charged whose free failed
}

var _ memapi.Account = Lease{}

// Authority returns the authority the lease is charged on ("" for a zero
// Lease).
func (l Lease) Authority() memapi.AuthorityID { return Grant(l).Authority() }

// Holder returns the holder the lease is charged to ("" for a zero or stale
// Lease).
func (l Lease) Holder() HolderID { return Grant(l).Holder() }

// Role returns what the memory was reserved for ("" for a zero or stale
// Lease).
func (l Lease) Role() Role { return Grant(l).Role() }

// lockLease takes the authority's mutex and settles the lease's commit if
// it was made without the lock. It returns the lease's figures; nil for a
// zero Lease, and then the mutex is not taken.
func (l Lease) lockLease() (*authority, *leaseFigures) {
	if Grant(l).zero() {
		return nil, nil
	}
	a := l.g.auth
	a.mu.Lock()
	a.settleGrantLocked(l.g)
	return a, &l.g.lease
}

// staleLocked reports whether l is of an earlier issue of its record:
// every method checks it under the lock, after lockLease's settle, where
// the issue cannot change under it (an issue under the lock waits for it,
// and one without it needs a grant refunded and not settled, which the
// settle leaves settled).
func (l Lease) staleLocked() bool {
	_, st, _ := l.g.loadAs(l.gen)
	return st == stateStale
}

// staleError is the failure of op on a zero or stale lease.
func (l Lease) staleError(op string) error { return Grant(l).closed(op) }

// figure reads one figure under the lock; 0 for a zero or stale lease.
func (l Lease) figure(f func(*leaseFigures) memapi.Bytes) memapi.Bytes {
	a, lf := l.lockLease()
	if a == nil {
		return 0
	}
	defer a.mu.Unlock()
	if l.staleLocked() {
		return 0
	}
	return f(lf)
}

// Charged returns the bytes charged and not pending.
func (l Lease) Charged() memapi.Bytes {
	return l.figure(func(f *leaseFigures) memapi.Bytes { return f.charged })
}

// Pending returns the bytes waiting for fences before their free.
func (l Lease) Pending() memapi.Bytes {
	return l.figure(func(f *leaseFigures) memapi.Bytes { return f.pending })
}

// Quarantined returns the part of the charged bytes whose free failed: the
// memory is still held by its mechanism, waiting for a retry.
func (l Lease) Quarantined() memapi.Bytes {
	return l.figure(func(f *leaseFigures) memapi.Bytes { return f.quarantined })
}

// Bytes returns charged + pending: what the lease still holds.
func (l Lease) Bytes() memapi.Bytes {
	return l.figure(func(f *leaseFigures) memapi.Bytes { return f.charged + f.pending })
}

// Refund returns n bytes whose memory was really freed: from pending first,
// then from charged. The bytes become free and waiting reservations are
// served. It fails with ErrOverReturn, changing nothing, beyond what the
// lease holds. A Refund that empties the lease ends its grant's use: the
// governor may issue both again (Reserve), which makes this Lease stale.
func (l Lease) Refund(n memapi.Bytes) error {
	// refundUnsettled in few instructions, for the common case: no
	// injector, the authority not closed.
	gr := l.g
	if gr == nil {
		return l.refund(n)
	}
	a := gr.auth
	install, toPool, ok := a.hints.place(gr)
	if !ok {
		return l.refund(n)
	}
	if refundChecked != nil {
		refundChecked()
	}
	// Committed without the lock (state 1), not slow (no injector), in
	// this handle's generation and epoch, with n bytes (the whole size,
	// never 0).
	w := gr.state.Load()
	if w>>genShift != stateCommit<<tagState|l.gen&genMax || gr.epoch.Load() != l.gen>>genBits || w&drawnMask != uint64(n) ||
		!gr.state.CompareAndSwap(w, w|stateRefunded<<stateShift) {
		return l.refund(n)
	}
	// gr.refunded(install, toPool), spelled out.
	if install || toPool {
		a.hints.keep(gr, install, toPool)
	}
	if a.queued.Load() {
		gr.serveRefunded()
	}
	return nil
}

// refund is Refund in every case.
func (l Lease) refund(n memapi.Bytes) error {
	const op = "governor.Lease.Refund"
	gr := l.g
	if Grant(l).zero() {
		return l.staleError(op)
	}
	if err := gr.inject(OpRefund, n); err != nil {
		return err
	}
	if n != 0 && !gr.auth.queued.Load() && l.refundUnsettled(n) {
		return nil
	}
	a, f := l.lockLease()
	if l.staleLocked() {
		a.mu.Unlock()
		return l.staleError(op)
	}
	if n != 0 && a.settleRefundLocked(gr, n) {
		if a.head != nil {
			a.serveLocked()
		}
		a.mu.Unlock()
		return nil
	}
	if held := f.charged + f.pending; n > held {
		a.mu.Unlock()
		return opError(op, ErrOverReturn, a.id, n, held, "refund beyond the lease")
	}
	gr.refundLocked(n)
	a.mu.Unlock()
	return nil
}

// refundChecked, when set (by tests, before anything runs concurrently),
// runs on Refund's lock-free path between its check that no reservation
// waits and its swap: a test queues a reservation there, the interleaving
// that only the wake after the swap (grant.refunded) serves.
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
// atomics): no waiter misses a refund.
//
// The grant becomes one of the authority's hints (a refunded grant Reserve
// issues again without the lock). It reports false, changing nothing, when
// the lock is needed (the authority closed) or l is stale.
func (l Lease) refundUnsettled(n memapi.Bytes) bool {
	gr := l.g
	install, toPool, ok := gr.auth.hints.place(gr)
	if !ok {
		return false
	}
	w, st, d := gr.loadAs(l.gen)
	if st != stateCommit || d != n || !gr.state.CompareAndSwap(w, with(w, stateRefunded, d)) {
		return false
	}
	if refundSwapped != nil {
		refundSwapped()
	}
	gr.refunded(install, toPool)
	return true
}

// refundSwapped, when set (by tests, before anything runs concurrently),
// runs in refundUnsettled between its swap and the keeping of its grant in
// the hints: a test closes the authority there, the interleaving in which
// only keep's compare-and-swap keeps the slot closed.
var refundSwapped func()

// refunded follows the swap that refunded gr's lease without the lock: a
// waiting reservation is served at once. It serves even when another
// settle booked the refund first (a snapshot, a reservation's), which does
// not serve.
//
// install and toPool are where the refund leaves gr in the authority's
// hints (hints.place). (A settle may have retired gr since the swap: then
// a hint names a grant that is not refunded, which nothing issues without
// the lock.)
func (gr *grant) refunded(install, toPool bool) {
	a := gr.auth
	if install || toPool {
		a.hints.keep(gr, install, toPool)
	}
	if a.queued.Load() {
		gr.serveRefunded()
	}
}

// serveRefunded books gr's refund, made without the lock, and serves the
// reservations waiting for it.
func (gr *grant) serveRefunded() {
	a := gr.auth
	a.mu.Lock()
	a.settleGrantLocked(gr)
	a.serveLocked()
	a.mu.Unlock()
}

// refundLocked refunds n bytes of gr's lease and reports whether that
// emptied it, which ends the grant's use and retires it.
func (gr *grant) refundLocked(n memapi.Bytes) bool {
	if n == 0 {
		return false
	}
	l := &gr.lease
	c := gr.acct
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
		a.retireLocked(gr)
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
func (l Lease) MarkPending(n memapi.Bytes) error {
	const op = "governor.Lease.MarkPending"
	if Grant(l).zero() {
		return l.staleError(op)
	}
	if err := l.g.inject(OpMarkPending, n); err != nil {
		return err
	}
	a, f := l.lockLease()
	if l.staleLocked() {
		a.mu.Unlock()
		return l.staleError(op)
	}
	defer a.mu.Unlock()
	c := l.g.acct
	if n > f.charged-f.quarantined {
		return opError(op, ErrOverReturn, a.id, n, f.charged-f.quarantined, "more than the charged bytes not quarantined")
	}
	f.charged -= n
	a.charged -= n
	c.charged -= n
	f.pending += n
	a.pending += n
	c.pending += n
	return nil
}

// Release refunds everything the lease still holds and returns how much that
// was. Releasing an empty lease, or a stale one, is a no-op.
func (l Lease) Release() memapi.Bytes {
	if Grant(l).zero() {
		return 0
	}
	if _, st, d := l.g.loadAs(l.gen); st == stateCommit && d != 0 && l.refundUnsettled(d) {
		return d
	}
	a, f := l.lockLease()
	if l.staleLocked() {
		a.mu.Unlock()
		return 0
	}
	n := f.charged + f.pending
	l.g.refundLocked(n)
	a.mu.Unlock()
	return n
}

// Quarantine books n bytes of the lease whose free failed (pending ones
// first, then charged ones) as quarantined: charged again, since the memory
// is still held, and shown apart in snapshots (Quarantined), never asked
// for by a ticket. A retry that frees them refunds them with
// RefundQuarantined. It fails with ErrOverReturn, changing nothing, beyond
// the bytes not quarantined yet.
func (l Lease) Quarantine(n memapi.Bytes) error {
	const op = "governor.Lease.Quarantine"
	if Grant(l).zero() {
		return l.staleError(op)
	}
	if err := l.g.inject(OpQuarantine, n); err != nil {
		return err
	}
	a, f := l.lockLease()
	if l.staleLocked() {
		a.mu.Unlock()
		return l.staleError(op)
	}
	defer a.mu.Unlock()
	c := l.g.acct
	if free := f.pending + f.charged - f.quarantined; n > free {
		return opError(op, ErrOverReturn, a.id, n, free, "more than the bytes not quarantined")
	}
	p := min(n, f.pending)
	f.pending -= p
	a.pending -= p
	c.pending -= p
	f.charged += p
	a.charged += p
	c.charged += p
	f.quarantined += n
	a.quarantined += n
	c.quar += n
	return nil
}

// RefundQuarantined returns n quarantined bytes that a retry really freed.
// It fails with ErrOverReturn, changing nothing, beyond the quarantined
// bytes.
func (l Lease) RefundQuarantined(n memapi.Bytes) error {
	const op = "governor.Lease.RefundQuarantined"
	if Grant(l).zero() {
		return l.staleError(op)
	}
	if err := l.g.inject(OpRefundQuarantined, n); err != nil {
		return err
	}
	a, f := l.lockLease()
	if l.staleLocked() {
		a.mu.Unlock()
		return l.staleError(op)
	}
	if n > f.quarantined {
		a.mu.Unlock()
		return opError(op, ErrOverReturn, a.id, n, f.quarantined, "more than the quarantined bytes")
	}
	// refundLocked takes pending first: refund from charged alone.
	c := l.g.acct
	f.quarantined -= n
	a.quarantined -= n
	c.quar -= n
	f.charged -= n
	a.charged -= n
	c.charged -= n
	if f.charged == 0 && f.pending == 0 && n != 0 {
		a.leases--
		c.leases--
		a.retireLocked(l.g)
	}
	if a.head != nil {
		a.serveLocked()
	}
	a.mu.Unlock()
	return nil
}
