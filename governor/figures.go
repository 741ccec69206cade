package governor

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// figures are bytes in each state of the ledger. An authority, each
// holder's account on it and each grant's record keep them alike, and
// every transition moves all three at once (authority.books), so an
// authority's figures are always the sum of its accounts' and of its
// records'.
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

// held is what a lease still holds.
func (f *figures) held() memapi.Bytes { return f.charged + f.pending }

// The transitions. Each is the one place its bytes move; the caller holds
// the authority's mutex and has checked that the transition is allowed.
// Each moves the fields it names in all three books at once.

// books are the figures every transition of gr moves alike: the
// authority's, gr's account's and gr's own.
func (a *authority) books(gr *grant) [3]*figures {
	return [3]*figures{&a.fig, &gr.acct.fig, &gr.fig}
}

// reserve books gr, a new record (its authority and size set, not booked
// yet), as an open grant of c for role: its bytes leave free.
func (a *authority) reserve(gr *grant, c *account, role Role, deadline time.Time) *grant {
	gr.acct = c
	for _, f := range a.books(gr) {
		f.reserved += gr.size
		f.grants++
	}
	a.granted++
	if !deadline.IsZero() {
		// The clock never calls the function before AfterFunc returns,
		// so scheduling under the lock is safe.
		gr.dl = &grantDeadline{at: deadline, role: role}
		gr.dl.timer = a.g.clock.AfterFunc(deadline.Sub(a.g.clock.Now()), gr.expire)
		a.timed[gr] = struct{}{}
	}
	return gr
}

// draw takes n bytes of open grant gr: installed backing, still reserved.
func (a *authority) draw(gr *grant, n memapi.Bytes) {
	for _, f := range a.books(gr) {
		f.drawn += n
	}
}

// undraw gives back n drawn bytes: to the open grant, or, for an expired
// one, to free.
func (a *authority) undraw(gr *grant, n memapi.Bytes) {
	if gr.state == stateOpen {
		for _, f := range a.books(gr) {
			f.drawn -= n
		}
		return
	}
	for _, f := range a.books(gr) {
		f.reserved -= n
		f.expiredDrawn -= n
	}
	a.serve()
}

// commit ends open grant gr: its drawn bytes become its lease's charge and
// the rest returns to free.
func (a *authority) commit(gr *grant) {
	d, size := gr.fig.drawn, gr.size
	a.end(gr, stateCommitted)
	for _, f := range a.books(gr) {
		f.reserved -= size
		f.drawn -= d
		f.charged += d
		f.grants--
		if d != 0 {
			f.leases++
		}
	}
	if d != size {
		a.serve()
	}
}

// cancel ends open grant gr, nothing drawn: all of it returns to free.
func (a *authority) cancel(gr *grant) {
	a.end(gr, stateCancelled)
	for _, f := range a.books(gr) {
		f.reserved -= gr.size
		f.grants--
	}
	a.serve()
}

// expire ends open grant gr at its deadline: the undrawn bytes return to
// free; the drawn ones stay reserved, as expired, until undrawn.
func (a *authority) expire(gr *grant) {
	d := gr.fig.drawn
	a.end(gr, stateExpired)
	for _, f := range a.books(gr) {
		f.reserved -= gr.size - d
		f.drawn -= d
		f.expiredDrawn += d
		f.grants--
	}
	a.expired++
	a.serve()
}

// end closes open grant gr in state st and stops its deadline timer.
func (a *authority) end(gr *grant, st grantState) {
	gr.state = st
	if gr.dl != nil && gr.dl.timer != nil {
		gr.dl.timer.Stop()
		gr.dl.timer = nil
		delete(a.timed, gr)
	}
}

// markPending moves n charged bytes of gr's lease to pending.
func (a *authority) markPending(gr *grant, n memapi.Bytes) {
	for _, f := range a.books(gr) {
		f.charged -= n
		f.pending += n
	}
}

// refund frees n bytes of gr's lease: pending ones first, then charged
// ones not quarantined, then quarantined ones. A lease it empties stops
// counting as one; waiting reservations are served.
func (a *authority) refund(gr *grant, n memapi.Bytes) {
	g := gr.fig
	p := min(n, g.pending)
	c := n - p
	q := c - min(c, g.charged-g.quarantined)
	empties := g.held() == n
	for _, f := range a.books(gr) {
		f.pending -= p
		f.charged -= c
		f.quarantined -= q
		if empties && n != 0 {
			f.leases--
		}
	}
	a.serve()
}

// quarantine books n bytes of gr's lease whose free failed: pending ones
// first become charged again, and n bytes are marked quarantined.
func (a *authority) quarantine(gr *grant, n memapi.Bytes) {
	p := min(n, gr.fig.pending)
	for _, f := range a.books(gr) {
		f.pending -= p
		f.charged += p
		f.quarantined += n
	}
}

// refundQuarantined frees n quarantined bytes of gr's lease: a lease it
// empties stops counting as one; waiting reservations are served.
func (a *authority) refundQuarantined(gr *grant, n memapi.Bytes) {
	empties := gr.fig.held() == n
	for _, f := range a.books(gr) {
		f.charged -= n
		f.quarantined -= n
		if empties && n != 0 {
			f.leases--
		}
	}
	a.serve()
}
