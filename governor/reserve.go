package governor

import (
	"context"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

const opReserve = "governor.Reserve"

// Reserve asks authority for a provisional grant of bytes for holder.
//
// When the bytes fit and nobody is waiting, it returns at once. Otherwise the
// request joins the authority's queue (served strictly in arrival order),
// pressure tickets are issued for the shortfall to the holders that can give
// memory (lower holder priority first, then the most bytes over the
// guarantee; guaranteed bytes are never asked for) and their Reclaim is
// called in this goroutine with ctx. The request then waits for refunds until
// it is served, ctx ends or deadline passes. priority is carried in the
// tickets so holders can weigh the request.
//
// deadline (zero: none) bounds both the wait and the grant: a grant still
// open at its deadline is reclaimed (see Grant). A wait with neither a
// deadline nor a cancellable ctx lasts until it is served or the governor
// closes.
//
// Failures: memapi.ErrInvalidSize for 0 bytes; ErrUnknownAuthority,
// ErrUnknownHolder; an *OverBudgetError of Kind ErrOverLimit when the
// holder's limit forbids the bytes, and of Kind memapi.ErrOverBudget when the
// bytes exceed the capacity or the wait ended (its Err is then the context's
// error or context.DeadlineExceeded); memapi.ErrClosed after Close. A failed
// Reserve leaves the ledger as it found it.
func (g *Governor) Reserve(ctx context.Context, authority memapi.AuthorityID, holder HolderID, role Role, bytes memapi.Bytes, priority Priority, deadline time.Time) (*Grant, error) {
	if bytes == 0 || bytes > maxBytes {
		return nil, opError(opReserve, memapi.ErrInvalidSize, authority, bytes, maxBytes, "")
	}
	a := g.authority(authority)
	if a == nil {
		return nil, opError(opReserve, ErrUnknownAuthority, authority, bytes, 0, "")
	}
	if !deadline.IsZero() && !g.clock.Now().Before(deadline) {
		return nil, &memapi.Error{Op: opReserve, Kind: memapi.ErrGrantClosed, Authority: authority, Wanted: bytes, Detail: "deadline already passed", Err: ErrExpired}
	}
	a.mu.Lock()
	if a.shut != nil {
		a.mu.Unlock()
		return nil, a.shut
	}
	c := a.accountLocked(holder)
	if c == nil {
		a.mu.Unlock()
		return nil, opError(opReserve, ErrUnknownHolder, authority, bytes, 0, "holder "+string(holder))
	}
	if c.limit != 0 && c.used()+c.waiting+bytes > c.limit {
		use := c.used() + c.waiting
		a.overBudget++
		a.mu.Unlock()
		return nil, &OverBudgetError{Op: opReserve, Kind: ErrOverLimit, Authority: authority, Holder: holder,
			Reason: "over the holder's limit", Wanted: bytes, Limit: c.limit, HolderUse: use}
	}
	if a.head == nil && a.freeLocked() >= bytes {
		gr := a.newGrantLocked(c, role, bytes, priority, deadline)
		a.mu.Unlock()
		return gr, nil
	}
	w := &waiter{acct: c, bytes: bytes, role: role, priority: priority, deadline: deadline}
	if bytes > a.capacity {
		err := a.overBudgetLocked(w, a.waitingBytes, "larger than the capacity", nil)
		a.mu.Unlock()
		g.emit(Event{Kind: EventOverBudget, Authority: authority, Holder: holder, Role: role, Bytes: bytes, Err: err})
		return nil, err
	}
	w.ready = make(chan struct{})
	a.pushLocked(w)
	a.waited++
	short := a.shortfallLocked(w)
	if short != 0 {
		a.pressureEvents++
		w.pressure = a.pressureEvents
		a.recent[(w.pressure-1)%pressureHistory] = PressureEvent{
			Time:        g.clock.Now(),
			Requester:   holder,
			Wanted:      bytes,
			Shortfall:   short,
			Free:        a.freeLocked(),
			Pending:     a.pending,
			Reclaimable: a.reclaimableLocked(),
		}
	}
	a.mu.Unlock()
	if short != 0 {
		g.emit(Event{Kind: EventPressure, Authority: authority, Holder: holder, Role: role, Bytes: short})
	}
	return g.wait(ctx, a, w)
}

// shortfallLocked is what the queue up to and including w lacks beyond the
// free bytes, the pending ones (already on their way back) and the bytes
// asked by tickets in flight.
func (a *authority) shortfallLocked(w *waiter) memapi.Bytes {
	need := a.aheadLocked(w) + w.bytes
	cover := a.freeLocked() + a.pending + a.asking
	if need <= cover {
		return 0
	}
	return need - cover
}

// plannedTicket is a ticket with the holder it goes to.
type plannedTicket struct {
	Ticket
	acct *account
}

// nextTicketLocked books a ticket for w's shortfall to the best holder not
// yet asked in this round: lower priority first, then the most reclaimable
// bytes, then the id. It returns nil when w is served, nothing is short, or
// no holder can give more.
func (a *authority) nextTicketLocked(w *waiter, asked []*account) *plannedTicket {
	if w.grant != nil || w.err != nil {
		return nil
	}
	short := a.shortfallLocked(w)
	if short == 0 {
		return nil
	}
	var best *account
	var bestR memapi.Bytes
	for _, c := range a.accts {
		r := c.reclaimable()
		if r == 0 || slices.Contains(asked, c) {
			continue
		}
		if best == nil || c.h.priority < best.h.priority ||
			c.h.priority == best.h.priority && (r > bestR || r == bestR && c.h.id < best.h.id) {
			best, bestR = c, r
		}
	}
	if best == nil {
		return nil
	}
	want := min(short, bestR)
	best.asking += want
	a.asking += want
	if w.pressure != 0 && a.pressureEvents-w.pressure < pressureHistory {
		a.recent[(w.pressure-1)%pressureHistory].Tickets++
	}
	return &plannedTicket{
		Ticket: Ticket{ID: a.g.ticketSeq.Add(1), Authority: a.id, Wanted: want, Priority: w.priority, Deadline: w.deadline},
		acct:   best,
	}
}

// wait asks holders for w's shortfall, one ticket at a time (so a holder
// that frees less than asked, or fails, is followed by the next one), then
// waits for w to be served.
func (g *Governor) wait(ctx context.Context, a *authority, w *waiter) (*Grant, error) {
	holder := w.acct.h.id
	var issued int
	var freed memapi.Bytes
	var asked []*account
	var current *plannedTicket
	settled := false
	defer func() {
		if settled {
			return
		}
		// A Reclaim (or the event hook) panicked: the panic goes on, but
		// no waiter or ask is left behind to block the queue.
		a.mu.Lock()
		if current != nil {
			current.acct.asking -= current.Wanted
			a.asking -= current.Wanted
		}
		a.abandonLocked(w)
		a.mu.Unlock()
	}()
	for ctx.Err() == nil {
		a.mu.Lock()
		t := a.nextTicketLocked(w, asked)
		a.mu.Unlock()
		if t == nil {
			break
		}
		asked = append(asked, t.acct)
		current = t
		h := t.acct.h
		g.emit(Event{Kind: EventTicket, Authority: a.id, Holder: h.id, Ticket: t.Ticket, Bytes: t.Wanted})
		n, err := h.reclaimer.Reclaim(ctx, t.Ticket)
		issued++
		freed += n
		a.mu.Lock()
		t.acct.asking -= t.Wanted
		a.asking -= t.Wanted
		t.acct.tickets++
		t.acct.freed += n
		a.tickets++
		a.freed += n
		if err != nil {
			t.acct.reclaimErrors++
		}
		current = nil
		a.mu.Unlock()
		if err != nil {
			g.log.Debug("governor: reclaim failed", "authority", a.id, "holder", h.id, "ticket", t.ID, "err", err)
		}
		g.emit(Event{Kind: EventReclaimed, Authority: a.id, Holder: h.id, Ticket: t.Ticket, Bytes: n, Err: err})
	}

	var expired <-chan struct{}
	if !w.deadline.IsZero() {
		d := w.deadline.Sub(g.clock.Now())
		ch := make(chan struct{})
		if d <= 0 {
			close(ch)
		} else {
			t := g.clock.AfterFunc(d, func() { close(ch) })
			defer t.Stop()
		}
		expired = ch
	}
	if !isClosed(w.ready) {
		g.emit(Event{Kind: EventWaiting, Authority: a.id, Holder: holder, Role: w.role, Bytes: w.bytes})
	}
	var cause error
	select {
	case <-w.ready:
	case <-ctx.Done():
		cause = context.Cause(ctx)
	case <-expired:
		cause = context.DeadlineExceeded
	}

	a.mu.Lock()
	settled = true
	switch {
	case w.err != nil:
		a.mu.Unlock()
		if ob, ok := w.err.(*OverBudgetError); ok {
			ob.Tickets, ob.Freed = issued, freed
			g.emit(Event{Kind: EventOverBudget, Authority: a.id, Holder: holder, Role: w.role, Bytes: w.bytes, Err: ob})
		}
		return nil, w.err
	case w.grant != nil && cause == nil:
		a.mu.Unlock()
		g.emit(Event{Kind: EventServed, Authority: a.id, Holder: holder, Role: w.role, Bytes: w.bytes})
		return w.grant, nil
	}
	ahead := a.abandonLocked(w)
	a.cancelled++
	err := a.overBudgetLocked(w, ahead, "not served before the wait ended", cause)
	err.Tickets, err.Freed = issued, freed
	a.mu.Unlock()
	g.emit(Event{Kind: EventOverBudget, Authority: a.id, Holder: holder, Role: w.role, Bytes: w.bytes, Err: err})
	return nil, err
}

// abandonLocked undoes w: it leaves the queue, or, when it was served at the
// instant its wait ended, its grant goes back, so a failed Reserve leaves
// the ledger as it found it. It returns the bytes that were queued ahead of w.
func (a *authority) abandonLocked(w *waiter) memapi.Bytes {
	switch {
	case w.err != nil:
		return 0
	case w.grant != nil:
		// Its own deadline timer may have expired it already, which
		// returned all of it (nothing was drawn from it).
		gr := w.grant
		if _, ok := gr.transition(stateCancel); ok {
			a.closeGrantLocked(gr)
			a.reserved -= gr.size
			gr.acct.reserved -= gr.size
			a.granted--
			a.serveLocked()
		}
		return 0
	}
	ahead := a.aheadLocked(w)
	wasHead := a.head == w
	a.removeLocked(w)
	if wasHead {
		a.serveLocked() // the next in line may fit now
	}
	return ahead
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
