package governor

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// figures are bytes in each state of the ledger. An authority, each
// holder's account on it and each grant's record keep them alike, and
// every transition moves all three at once (authority.book), so an
// authority's figures are always the sum of its accounts' and of its
// records'.
type figures struct {
	reserved     memapi.Bytes // open grants' sizes, and expired grants' drawn bytes
	drawn        memapi.Bytes // the part of reserved drawn from open grants
	expiredDrawn memapi.Bytes // the part of reserved held by expired grants
	charged      memapi.Bytes // committed bytes of leases
	pending      memapi.Bytes // released bytes waiting for fences
	quarantined  memapi.Bytes // the part of charged whose free failed
	grants       int          // open grants
	leases       int          // leases holding bytes
}

// delta is one transition's change to the figures (negative: taken away).
type delta struct {
	reserved, drawn, expiredDrawn, charged, pending, quarantined int64
	grants, leases                                               int
}

func (f *figures) add(d delta) {
	f.reserved += memapi.Bytes(d.reserved)
	f.drawn += memapi.Bytes(d.drawn)
	f.expiredDrawn += memapi.Bytes(d.expiredDrawn)
	f.charged += memapi.Bytes(d.charged)
	f.pending += memapi.Bytes(d.pending)
	f.quarantined += memapi.Bytes(d.quarantined)
	f.grants += d.grants
	f.leases += d.leases
}

func (f *figures) used() memapi.Bytes { return f.reserved + f.charged + f.pending }

// held is what a lease still holds.
func (f *figures) held() memapi.Bytes { return f.charged + f.pending }

// The transitions. Each is the one place its bytes move; the caller holds
// the authority's mutex and has checked that the transition is allowed.

// book applies d to the authority's figures, gr's account's and gr's own.
func (a *authority) book(gr *grant, d delta) {
	a.fig.add(d)
	gr.acct.fig.add(d)
	gr.fig.add(d)
}

// reserve makes the record of a new open grant of size bytes for c: the
// bytes leave free.
func (a *authority) reserve(c *account, role Role, size memapi.Bytes, deadline time.Time) *grant {
	gr := &grant{a: a, acct: c, role: role, size: size}
	a.book(gr, delta{reserved: int64(size), grants: 1})
	a.granted++
	if !deadline.IsZero() {
		// The clock never calls the function before AfterFunc returns,
		// so scheduling under the lock is safe.
		gr.dl = &grantDeadline{at: deadline}
		gr.dl.timer = a.g.clock.AfterFunc(deadline.Sub(a.g.clock.Now()), gr.expire)
		a.timed[gr] = struct{}{}
	}
	return gr
}

// draw takes n bytes of open grant gr: installed backing, still reserved.
func (a *authority) draw(gr *grant, n memapi.Bytes) { a.book(gr, delta{drawn: int64(n)}) }

// undraw gives back n drawn bytes: to the open grant, or, for an expired
// one, to free.
func (a *authority) undraw(gr *grant, n memapi.Bytes) {
	if gr.state == stateOpen {
		a.book(gr, delta{drawn: -int64(n)})
		return
	}
	a.book(gr, delta{reserved: -int64(n), expiredDrawn: -int64(n)})
	a.serve()
}

// commit ends open grant gr: its drawn bytes become its lease's charge and
// the rest returns to free.
func (a *authority) commit(gr *grant) {
	d := gr.fig.drawn
	leases := 0
	if d != 0 {
		leases = 1
	}
	a.end(gr, stateCommitted)
	a.book(gr, delta{reserved: -int64(gr.size), drawn: -int64(d), charged: int64(d), grants: -1, leases: leases})
	if d != gr.size {
		a.serve()
	}
}

// cancel ends open grant gr, nothing drawn: all of it returns to free.
func (a *authority) cancel(gr *grant) {
	a.end(gr, stateCancelled)
	a.book(gr, delta{reserved: -int64(gr.size), grants: -1})
	a.serve()
}

// expire ends open grant gr at its deadline: the undrawn bytes return to
// free; the drawn ones stay reserved, as expired, until undrawn.
func (a *authority) expire(gr *grant) {
	d := gr.fig.drawn
	a.end(gr, stateExpired)
	a.book(gr, delta{reserved: -int64(gr.size - d), drawn: -int64(d), expiredDrawn: int64(d), grants: -1})
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
	a.book(gr, delta{charged: -int64(n), pending: int64(n)})
}

// refund frees n bytes of gr's lease: pending ones first, then charged
// ones not quarantined, then quarantined ones.
func (a *authority) refund(gr *grant, n memapi.Bytes) {
	f := &gr.fig
	p := min(n, f.pending)
	c := n - p
	q := c - min(c, f.charged-f.quarantined)
	a.release(gr, delta{pending: -int64(p), charged: -int64(c), quarantined: -int64(q)})
}

// quarantine books n bytes of gr's lease whose free failed: pending ones
// first become charged again, and n bytes are marked quarantined.
func (a *authority) quarantine(gr *grant, n memapi.Bytes) {
	p := min(n, gr.fig.pending)
	a.book(gr, delta{pending: -int64(p), charged: int64(p), quarantined: int64(n)})
}

// refundQuarantined frees n quarantined bytes of gr's lease.
func (a *authority) refundQuarantined(gr *grant, n memapi.Bytes) {
	a.release(gr, delta{charged: -int64(n), quarantined: -int64(n)})
}

// release books a refund d of gr's lease; a lease it empties stops
// counting as one. Waiting reservations are served.
func (a *authority) release(gr *grant, d delta) {
	before := gr.fig.held()
	a.book(gr, d)
	if before != 0 && gr.fig.held() == 0 {
		a.book(gr, delta{leases: -1})
	}
	a.serve()
}
