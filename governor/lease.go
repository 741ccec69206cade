package governor

import "github.com/memgen/memgen/generated/memapi"

// Lease is a holder's charge for committed memory, made by Grant.Commit. Its
// bytes are charged until the holder marks them pending (memory released but
// waiting for device fences) and refunded when the memory is really freed.
// It implements memapi.Account, so the checked wrappers refund to it.
//
// A Lease is a handle on the record of the grant it was committed from, and
// records are never reused: once the lease was emptied, its figures read 0
// and every refund of more than 0 bytes fails with memapi.ErrInvalidSize, for ever.
// A copy of a Lease is the same handle. The zero Lease was never committed:
// its methods fail with memapi.ErrGrantClosed.
//
// All methods are safe for concurrent use.
type Lease struct{ g *grant }

var _ memapi.Account = Lease{}

// Authority returns the authority the lease is charged on ("" for a zero
// Lease).
func (l Lease) Authority() memapi.AuthorityID { return Grant(l).Authority() }

// figure reads one of the lease's numbers; 0 for a zero Lease.
func (l Lease) figure(f func(*grant) memapi.Bytes) memapi.Bytes {
	var n memapi.Bytes
	Grant(l).read(func(gr *grant) { n = f(gr) })
	return n
}

// Bytes returns charged + pending: what the lease still holds.
func (l Lease) Bytes() memapi.Bytes {
	return l.figure(func(gr *grant) memapi.Bytes { return gr.bytes + gr.pending })
}

// lock is how a lease's method starts (Refund and MarkPending, on the
// common path, do the same in their bodies): Grant.enter when the record
// has something to check (or the lease is zero), then the authority's
// lock; a grant not committed is refused.
func (l Lease) lock(op string, n memapi.Bytes, inject bool) (*authority, error) {
	gr := l.g
	if gr == nil || gr.checks {
		if err := Grant(l).enter(op, n, inject); err != nil {
			return nil, err
		}
	}
	a := gr.a
	a.mu.Lock()
	if gr.state != stateCommitted {
		a.mu.Unlock()
		return nil, opError(op, memapi.ErrGrantClosed, a.id, n, 0, "the grant was not committed")
	}
	return a, nil
}

// Refund returns n bytes whose memory was really freed: from pending first,
// then from charged. The bytes become free and waiting reservations are
// served. It fails with memapi.ErrInvalidSize, changing nothing, beyond what the
// lease holds.
func (l Lease) Refund(n memapi.Bytes) error {
	const op = "governor.Lease.Refund"
	gr := l.g
	if gr == nil || gr.checks {
		if err := Grant(l).enter(op, n, true); err != nil {
			return err
		}
	}
	a := gr.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if gr.state != stateCommitted {
		return opError(op, memapi.ErrGrantClosed, a.id, n, 0, "the grant was not committed")
	}
	if held := gr.bytes + gr.pending; n > held {
		return opError(op, errOverReturn, a.id, n, held, "refund beyond the lease")
	}
	a.refund(gr, n)
	return nil
}

// MarkPending moves n charged bytes to pending: the holder released the
// memory but its free waits for device fences. Refund them when it happens.
// It fails with memapi.ErrInvalidSize, changing nothing, beyond the charged bytes.
// Quarantined bytes are not marked: their free already failed.
func (l Lease) MarkPending(n memapi.Bytes) error {
	const op = "governor.Lease.MarkPending"
	gr := l.g
	if gr == nil || gr.checks {
		if err := Grant(l).enter(op, n, true); err != nil {
			return err
		}
	}
	a := gr.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if gr.state != stateCommitted {
		return opError(op, memapi.ErrGrantClosed, a.id, n, 0, "the grant was not committed")
	}
	if free := gr.bytes - gr.quarantined; n > free {
		return opError(op, errOverReturn, a.id, n, free, "more than the charged bytes not quarantined")
	}
	gr.bytes -= n // the transition: charged to pending
	gr.pending += n
	for _, f := range gr.acct.books {
		f.charged -= n
		f.pending += n
	}
	return nil
}

// release refunds everything the lease still holds and returns how much
// that was (the tests' shorthand for Refund(Bytes())). Releasing an empty
// lease is a no-op; the Injector is not consulted.
func (l Lease) release() memapi.Bytes {
	a, err := l.lock("governor.Lease.release", 0, false)
	if err != nil {
		return 0
	}
	defer a.mu.Unlock()
	n := l.g.bytes + l.g.pending
	a.refund(l.g, n)
	return n
}

// Quarantine books n bytes of the lease whose free failed (pending ones
// first, then charged ones) as quarantined: charged again, since the memory
// is still held, and shown apart in snapshots (Quarantined), never asked
// for by a ticket. A retry that frees them refunds them to
// QuarantinedAccount. It fails with memapi.ErrInvalidSize, changing nothing, beyond
// the bytes not quarantined yet.
func (l Lease) Quarantine(n memapi.Bytes) error {
	const op = "governor.Lease.Quarantine"
	a, err := l.lock(op, n, true)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	gr := l.g
	if free := (gr.bytes + gr.pending) - gr.quarantined; n > free {
		return opError(op, errOverReturn, a.id, n, free, "more than the bytes not quarantined")
	}
	a.quarantine(l.g, n)
	return nil
}

// refundQuarantined returns n quarantined bytes that a retry really freed
// (QuarantinedAccount).
func (l Lease) refundQuarantined(n memapi.Bytes) error {
	const op = "governor.Lease.RefundQuarantined"
	a, err := l.lock(op, n, true)
	if err != nil {
		return err
	}
	defer a.mu.Unlock()
	if q := l.g.quarantined; n > q {
		return opError(op, errOverReturn, a.id, n, q, "more than the quarantined bytes")
	}
	a.refundQuarantined(l.g, n)
	return nil
}
