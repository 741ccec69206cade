package governor

import "github.com/memgen/memgen/generated/memapi"

// figures are bytes in each state of the ledger. An authority and each
// holder's account on it keep them, a grant's record its share of them
// (grant.bytes, pending, quarantined), and every transition moves all three at once (the record's
// own numbers and its account's books), so an authority's figures are always the
// sum of its accounts' and of its records'.
type figures struct {
	reserved     memapi.Bytes // open grants' sizes, and expired grants' drawn bytes
	drawn        memapi.Bytes // the part of reserved drawn from open grants
	expiredDrawn memapi.Bytes // the part of reserved held by expired grants
	charged      memapi.Bytes // committed bytes of leases
	pending      memapi.Bytes // released bytes waiting for fences
	quarantined  memapi.Bytes // the part of charged whose free failed
	grants       int32        // open grants
	leases       int32        // leases holding bytes
}

func (f *figures) used() memapi.Bytes { return f.reserved + f.charged + f.pending }

// The transitions. Each is the one place its bytes move (reserve is in
// reserve.go; Grant.Draw, Grant.Commit and Lease.MarkPending move theirs in
// their bodies); the caller holds the authority's
// mutex and has checked that the transition is allowed. Each moves the
// record's own numbers and the fields it names in both books of the record
// (account.books) at once.

// undraw gives back n drawn bytes: to the open grant, or, for an expired
// one, to free.
func (a *authority) undraw(gr *grant, n memapi.Bytes) {
	gr.bytes -= n
	if gr.state == stateOpen {
		for _, f := range gr.acct.books {
			f.drawn -= n
		}
		return
	}
	for _, f := range gr.acct.books {
		f.reserved -= n
		f.expiredDrawn -= n
	}
	a.serve()
}

// cancel ends open grant gr, nothing drawn: all of it returns to free.
func (a *authority) cancel(gr *grant) {
	gr.state = stateCancelled
	a.stopTimer(gr)
	for _, f := range gr.acct.books {
		f.reserved -= gr.size
		f.grants--
	}
	a.serve()
}

// expire ends open grant gr at its deadline: the undrawn bytes return to
// free; the drawn ones stay reserved, as expired, until undrawn.
func (a *authority) expire(gr *grant) {
	d := gr.bytes
	gr.state = stateExpired // gr.bytes: drawn, now expired drawn
	a.stopTimer(gr)
	for _, f := range gr.acct.books {
		f.reserved -= gr.size - d
		f.drawn -= d
		f.expiredDrawn += d
		f.grants--
	}
	a.expired++
	a.serve()
}

// stopTimer stops the deadline timer of gr, which just ended, if it runs.
func (a *authority) stopTimer(gr *grant) {
	if gr.dl != nil && gr.dl.timer != nil {
		gr.dl.timer()
		gr.dl.timer = nil
		delete(a.timed, gr)
	}
}

// refund frees n bytes of gr's lease: pending ones first, then charged
// ones not quarantined, then quarantined ones. A lease it empties stops
// counting as one; waiting reservations are served.
func (a *authority) refund(gr *grant, n memapi.Bytes) {
	p := min(n, gr.pending)
	c := n - p
	q := c - min(c, gr.bytes-gr.quarantined)
	empties := gr.bytes+gr.pending == n
	gr.pending -= p
	gr.bytes -= c
	gr.quarantined -= q
	for _, f := range gr.acct.books {
		f.pending -= p
		f.charged -= c
		f.quarantined -= q
		if empties && n != 0 {
			f.leases--
		}
	}
	if a.head != nil {
		a.serve()
	}
}

// quarantine books n bytes of gr's lease whose free failed: pending ones
// first become charged again, and n bytes are marked quarantined.
func (a *authority) quarantine(gr *grant, n memapi.Bytes) {
	p := min(n, gr.pending)
	gr.pending -= p
	gr.bytes += p
	gr.quarantined += n
	for _, f := range gr.acct.books {
		f.pending -= p
		f.charged += p
		f.quarantined += n
	}
}

// refundQuarantined frees n quarantined bytes of gr's lease: a lease it
// empties stops counting as one; waiting reservations are served.
func (a *authority) refundQuarantined(gr *grant, n memapi.Bytes) {
	empties := (gr.bytes + gr.pending) == n
	gr.bytes -= n
	gr.quarantined -= n
	for _, f := range gr.acct.books {
		f.charged -= n
		f.quarantined -= n
		if empties && n != 0 {
			f.leases--
		}
	}
	a.serve()
}
