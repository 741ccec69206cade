package governor

import (
	"context"
	"slices"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

const opReserve = "governor.Reserve"

// Request asks an authority for a provisional grant of Bytes for Holder.
type Request struct {
	Authority memapi.AuthorityID
	Holder    HolderID
	Role      Role         // what the bytes are for, carried by the grant and its lease
	Bytes     memapi.Bytes // more than 0
	Priority  Priority     // carried in the pressure tickets, so holders can weigh the request
	// Deadline (zero: none) bounds the grant: one still open at it is
	// reclaimed (see Grant). A reservation does not wait past it either,
	// as if its ctx ended there.
	Deadline time.Time
}

// Reserve asks r.Authority for a provisional grant of r.Bytes for r.Holder.
//
// When the bytes fit and nobody is waiting, it returns at once. Otherwise the
// request joins the authority's queue (served strictly in arrival order),
// pressure tickets are issued for the shortfall to the holders that can give
// memory (lower holder priority first, then the most bytes over the
// guarantee; guaranteed bytes are never asked for) and their Reclaim is
// called in this goroutine with ctx. The request then waits for refunds until
// it is served or ctx ends (or r.Deadline passes). The same ctx bounds an
// authority's Admission (SetAdmission), and with it the waits of a shared
// ledger's locks (governor/xproc).
//
// A reservation whose ctx has no deadline (context.Background()), and that
// has no Deadline, waits at most the governor's Options.DefaultWait
// (DefaultWaitBound, 30 s, unless set), then fails with an *OverBudgetError
// whose Err is ErrDefaultWait; with Options.DefaultWait negative it waits
// until it is served, ctx is cancelled or the governor closes.
//
// Grants are recycled: once a grant was cancelled, or committed and its
// lease emptied by a refund (Refund, Release, RefundQuarantined), the
// governor may issue its record again to a later Reserve. So the
// reservation cycle allocates nothing. Until that reissue, the old grant
// refuses every use as closed (and its empty lease every refund); from it
// on, the old Grant and Lease are stale handles, refused with
// ErrStaleHandle, changing nothing.
//
// Failures: memapi.ErrInvalidSize for 0 bytes; ErrUnknownAuthority,
// ErrUnknownHolder; an *OverBudgetError of Kind ErrOverLimit when the
// holder's limit forbids the bytes, and of Kind memapi.ErrOverBudget when the
// bytes exceed the capacity or the wait ended (its Err is then the context's
// error or context.DeadlineExceeded); memapi.ErrClosed after Close; the
// Injector's error (Options.Injector). A failed Reserve leaves the ledger as
// it found it.
func (g *Governor) Reserve(ctx context.Context, r Request) (Grant, error) {
	// The same reservation again, right after the whole refund of the
	// last one's lease without the lock: the bytes never left, so the
	// grant opens again in one swap (grant.reissue), in few instructions.
	// (With an Injector every grant is slow, and reissue refuses it.)
	a := g.last.Load()
	if a == nil || !r.Deadline.IsZero() || !sameString(string(a.id), string(r.Authority)) {
		return g.reserve(ctx, r)
	}
	gr := a.hints.slot.Load()
	if gr == nil {
		return g.reserve(ctx, r)
	}
	w := gr.state.Load()
	if w&drawnMask == uint64(r.Bytes) {
		if next, ok := gr.reissue(w); ok {
			if !gr.matches(r.Holder, r.Role, r.Priority) {
				return g.reserveSlow(ctx, a, r, gr, next)
			}
			return gr.handle(next), nil
		}
	}
	return g.reserveFromPool(ctx, a, r, gr, w)
}

// reserveFromPool is Reserve when the authority's slot held no grant for r
// (it held slot, whose word was w): one refunded on this P, from the pool,
// or else the lock. A slot's grant in use means another stream runs at
// the same time (hints.contended).
func (g *Governor) reserveFromPool(ctx context.Context, a *authority, r Request, slot *grant, w uint64) (Grant, error) {
	if st := w >> stateShift; (st == stateOpen || st == stateCommit) && slot != &pooledHint && slot != &closedHint {
		a.hints.contended(slot)
	}
	if gr, _ := a.hints.pool.Get().(*grant); gr != nil {
		w := gr.state.Load()
		if w&drawnMask == uint64(r.Bytes) {
			if next, ok := gr.reissue(w); ok {
				if !gr.matches(r.Holder, r.Role, r.Priority) {
					return g.reserveSlow(ctx, a, r, gr, next)
				}
				return gr.handle(next), nil
			}
		}
		switch {
		case w>>stateShift != stateRefunded:
			// In use, or its use ended under the lock: not a hint any more.
		case wordGen(w) == genMax:
			// Issued as often as its word counts: the lock issues it
			// next (its settle retires it). A stream that got this far
			// on the pool tries the slot again.
			a.mu.Lock()
			a.settleGrantLocked(gr)
			a.mu.Unlock()
			a.hints.retry()
		default:
			a.hints.pool.Put(gr) // refunded, not for r: for another reservation
		}
	}
	return g.reserve(ctx, r)
}

// matches reports whether gr, which the caller just issued again without
// the lock (so nothing writes these fields now), was last issued for the
// same holder, role and priority.
func (gr *grant) matches(holder HolderID, role Role, pri Priority) bool {
	return pri == gr.priority && sameString(string(gr.holder), string(holder)) && sameString(string(gr.role), string(role))
}

// sameString is a == b, without comparing the bytes of one string with
// themselves (a request's fields are usually the very strings it gave
// last time).
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// reserve is Reserve in every case.
func (g *Governor) reserve(ctx context.Context, r Request) (Grant, error) {
	if g.inject != nil {
		if err := g.inject.MaybeError(OpReserve, r.Authority, r.Bytes); err != nil {
			return Grant{}, err
		}
	}
	a := g.last.Load()
	if a == nil || a.id != r.Authority || a.closed.Load() {
		if a = g.authority(r.Authority); a == nil {
			if err := g.checkReserve(r.Authority, r.Bytes, r.Deadline); err != nil {
				return Grant{}, err
			}
			return Grant{}, opError(opReserve, ErrUnknownAuthority, r.Authority, r.Bytes, 0, "")
		}
		g.last.Store(a)
	}
	return g.reserveSlow(ctx, a, r, nil, 0)
}

// reserveSlow is Reserve under the authority's lock. claimed, when not
// nil, is a grant the caller issued again without the lock (grant.reissue,
// its word now w) for a request that does not match it: it goes back first
// (authority.unclaimLocked).
func (g *Governor) reserveSlow(ctx context.Context, a *authority, r Request, claimed *grant, w uint64) (Grant, error) {
	if claimed != nil {
		a.mu.Lock()
		a.unclaimLocked(claimed, w)
		a.mu.Unlock()
	}
	if err := g.checkReserve(r.Authority, r.Bytes, r.Deadline); err != nil {
		return Grant{}, err
	}
	a.mu.Lock()
	if a.shut != nil {
		a.mu.Unlock()
		return Grant{}, a.shut
	}
	c := a.accountLocked(r.Holder)
	if c == nil {
		a.mu.Unlock()
		return Grant{}, opError(opReserve, ErrUnknownHolder, r.Authority, r.Bytes, 0, "holder "+string(r.Holder))
	}
	gr, err := g.reserveLocked(ctx, a, c, r.Role, r.Bytes, r.Priority, r.Deadline)
	if err != nil {
		return Grant{}, err
	}
	// An issue under the lock starts the record's epoch at generation 0,
	// and nothing issues it again before its use ends.
	return Grant{g: gr, gen: gr.epoch.Load() << genBits}, nil
}

// checkReserve refuses what no ledger state can grant.
func (g *Governor) checkReserve(authority memapi.AuthorityID, bytes memapi.Bytes, deadline time.Time) error {
	if bytes == 0 || bytes > maxBytes {
		return opError(opReserve, memapi.ErrInvalidSize, authority, bytes, maxBytes, "")
	}
	if !deadline.IsZero() && !g.clock.Now().Before(deadline) {
		return &memapi.Error{Op: opReserve, Kind: memapi.ErrGrantClosed, Authority: authority, Wanted: bytes, Detail: "deadline already passed", Err: ErrExpired}
	}
	return nil
}

// reserveLocked is Reserve once the authority and the holder's account are
// resolved, called with a.mu held (it releases it).
func (g *Governor) reserveLocked(ctx context.Context, a *authority, c *account, role Role, bytes memapi.Bytes, priority Priority, deadline time.Time) (*grant, error) {
	if a.head == nil && a.freeLocked() >= bytes && (c.limit == 0 || c.used()+c.waiting+bytes <= c.limit) {
		gr := a.newGrantLocked(c, role, bytes, priority, deadline)
		a.mu.Unlock()
		return gr, nil
	}
	// Refunds not settled yet show as reserved: count them before refusing.
	a.settleLocked()
	if err := a.overLimitLocked(c, bytes); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if a.head == nil && a.freeLocked() >= bytes {
		gr := a.newGrantLocked(c, role, bytes, priority, deadline)
		a.mu.Unlock()
		return gr, nil
	}
	if a.admit != nil {
		return g.admitLocked(ctx, a, c, role, bytes, priority, deadline)
	}
	return g.queueLocked(ctx, a, c, role, bytes, priority, deadline)
}

// overLimitLocked refuses bytes beyond c's holder limit (counted as an
// over-budget refusal), or returns nil.
func (a *authority) overLimitLocked(c *account, bytes memapi.Bytes) error {
	if c.limit == 0 || c.used()+c.waiting+bytes <= c.limit {
		return nil
	}
	a.overBudget++
	return &OverBudgetError{Op: opReserve, Kind: ErrOverLimit, Authority: a.id, Holder: c.h.id,
		Reason: "over the holder's limit", Wanted: bytes, Limit: c.limit, HolderUse: c.used() + c.waiting}
}

// queueLocked is the slow path of reserveLocked: the request fails at once
// or joins the queue, asks holders for the shortfall and waits.
func (g *Governor) queueLocked(ctx context.Context, a *authority, c *account, role Role, bytes memapi.Bytes, priority Priority, deadline time.Time) (*grant, error) {
	holder := c.h.id
	w := &waiter{acct: c, bytes: bytes, role: role, priority: priority, deadline: deadline}
	if bytes > a.capacity && (a.admit == nil || ctx.Done() == nil && deadline.IsZero()) {
		// (An Admission may raise the capacity for one that waits.)
		err := a.overBudgetLocked(w, a.waitingBytes, "larger than the capacity", nil)
		a.mu.Unlock()
		g.emit(Event{Kind: EventOverBudget, Authority: a.id, Holder: holder, Role: role, Bytes: bytes, Err: err})
		return nil, err
	}
	w.ready = make(chan struct{})
	a.pushLocked(w)
	a.waited++
	// A refund without the lock that came after the settle above, but saw
	// no waiter, is booked here (see Lease.refundUnsettled).
	if a.settleLocked() {
		a.serveLocked()
	}
	var short memapi.Bytes
	if w.grant == nil {
		short = a.shortfallLocked(w)
	}
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
	return g.wait(ctx, a, w, short)
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

// askBefore reports whether holder account c (reclaimable r) is asked
// before best (reclaimable bestR) for requester's shortfall: caches first
// (HolderOptions.Cache), the requester's own cache first among them, then
// lower priority, then the most reclaimable bytes, then the id.
func askBefore(c *account, r memapi.Bytes, best *account, bestR memapi.Bytes, requester *account) bool {
	if c.h.cache != best.h.cache {
		return c.h.cache
	}
	if c.h.cache && (c == requester) != (best == requester) {
		return c == requester
	}
	if c.h.priority != best.h.priority {
		return c.h.priority < best.h.priority
	}
	return r > bestR || r == bestR && c.h.id < best.h.id
}

// nextTicketLocked books a ticket for w's shortfall to the best holder not
// yet asked in this round (askBefore): caches first, then lower priority,
// then the most reclaimable bytes, then the id. It returns nil when w is served, nothing is short, or
// no holder can give more.
func (a *authority) nextTicketLocked(w *waiter, asked []*account) *plannedTicket {
	if w.grant != nil || w.err != nil {
		return nil
	}
	a.settleLocked()
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
		if best == nil || askBefore(c, r, best, bestR, w.acct) {
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
//
// Every callback it makes (the event hook, a holder's Reclaim) runs after
// the cleanup below is armed: should one panic, w leaves the queue (or its
// grant goes back) and no ask stays booked, then the panic goes on.
func (g *Governor) wait(ctx context.Context, a *authority, w *waiter, short memapi.Bytes) (*grant, error) {
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
	if short != 0 {
		g.emit(Event{Kind: EventPressure, Authority: a.id, Holder: holder, Role: w.role, Bytes: short})
	}
	// A holder's Reclaim answers for this reservation: it gets a context
	// that ends at the reservation's deadline, so a Reclaim that waits on
	// its context never keeps Reserve waiting past it.
	// With no deadline anywhere, the governor's default wait bounds it
	// (the grant keeps no deadline: only the wait is bounded).
	until, timeout := w.deadline, error(context.DeadlineExceeded)
	if _, ok := ctx.Deadline(); until.IsZero() && !ok && g.defaultWait > 0 {
		until, timeout = g.clock.Now().Add(g.defaultWait), ErrDefaultWait
	}
	rctx := ctx
	if !until.IsZero() {
		c, stop := context.WithCancelCause(ctx)
		t := g.clock.AfterFunc(until.Sub(g.clock.Now()), func() { stop(timeout) })
		defer t.Stop()
		defer stop(nil)
		rctx = c
	}
	for rctx.Err() == nil {
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
		n, err := h.reclaimer.Reclaim(rctx, t.Ticket)
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
	if !until.IsZero() {
		d := until.Sub(g.clock.Now())
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
		cause = timeout
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
		// A hook that panics here would strand a grant nobody owns: it
		// goes back first.
		served := false
		defer func() {
			if !served {
				a.mu.Lock()
				a.abandonLocked(w)
				a.mu.Unlock()
			}
		}()
		g.emit(Event{Kind: EventServed, Authority: a.id, Holder: holder, Role: w.role, Bytes: w.bytes})
		served = true
		return w.grant, nil
	}
	ahead := a.abandonLocked(w)
	a.cancelled++
	reason := "not served before the wait ended"
	if cause == ErrDefaultWait {
		reason = "not served within the governor's default wait of " + g.defaultWait.String() + " (the reservation had no deadline)"
	}
	err := a.overBudgetLocked(w, ahead, reason, cause)
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
			a.reserved -= gr.sz()
			gr.acct.reserved -= gr.sz()
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
