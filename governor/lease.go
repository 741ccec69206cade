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
	// guarded by g.auth.mu
	charged memapi.Bytes
	pending memapi.Bytes
}

var _ memapi.Account = (*Lease)(nil)

// Authority returns the authority the lease is charged on.
func (l *Lease) Authority() memapi.AuthorityID { return l.g.auth.id }

// Holder returns the holder the lease is charged to.
func (l *Lease) Holder() HolderID { return l.g.acct.h.id }

// Role returns what the memory was reserved for.
func (l *Lease) Role() Role { return l.g.role }

// Charged returns the bytes charged and not pending.
func (l *Lease) Charged() memapi.Bytes {
	l.g.auth.mu.Lock()
	defer l.g.auth.mu.Unlock()
	return l.charged
}

// Pending returns the bytes waiting for fences before their free.
func (l *Lease) Pending() memapi.Bytes {
	l.g.auth.mu.Lock()
	defer l.g.auth.mu.Unlock()
	return l.pending
}

// Bytes returns charged + pending: what the lease still holds.
func (l *Lease) Bytes() memapi.Bytes {
	l.g.auth.mu.Lock()
	defer l.g.auth.mu.Unlock()
	return l.charged + l.pending
}

// Refund returns n bytes whose memory was really freed: from pending first,
// then from charged. The bytes become free and waiting reservations are
// served. It fails with ErrOverReturn, changing nothing, beyond what the
// lease holds.
func (l *Lease) Refund(n memapi.Bytes) error {
	a := l.g.auth
	a.mu.Lock()
	defer a.mu.Unlock()
	if held := l.charged + l.pending; n > held {
		return opError("governor.Lease.Refund", ErrOverReturn, a.id, n, held, "refund beyond the lease")
	}
	l.refundLocked(n)
	return nil
}

func (l *Lease) refundLocked(n memapi.Bytes) {
	if n == 0 {
		return
	}
	a, c := l.g.auth, l.g.acct
	fromPending := min(n, l.pending)
	fromCharged := n - fromPending
	l.pending -= fromPending
	a.pending -= fromPending
	c.pending -= fromPending
	l.charged -= fromCharged
	a.charged -= fromCharged
	c.charged -= fromCharged
	if l.charged == 0 && l.pending == 0 {
		a.leases--
		c.leases--
	}
	a.serveLocked()
}

// MarkPending moves n charged bytes to pending: the holder released the
// memory but its free waits for device fences. Refund them when it happens.
// It fails with ErrOverReturn, changing nothing, beyond the charged bytes.
func (l *Lease) MarkPending(n memapi.Bytes) error {
	a, c := l.g.auth, l.g.acct
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > l.charged {
		return opError("governor.Lease.MarkPending", ErrOverReturn, a.id, n, l.charged, "more than the charged bytes")
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
	a := l.g.auth
	a.mu.Lock()
	defer a.mu.Unlock()
	n := l.charged + l.pending
	l.refundLocked(n)
	return n
}
