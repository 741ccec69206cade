package governor

import (
	"context"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

const opReserve = "governor.Reserve"

// Request asks an authority for a provisional grant of Bytes for Holder.
type Request struct {
	Authority memapi.AuthorityID
	Holder    HolderID
	Role      string       // what the bytes are for, carried by the grant and its lease
	Bytes     memapi.Bytes // more than 0
	Priority  int          // carried in the pressure tickets, so holders can weigh the request
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
// (defaultWaitBound, 30 s, unless set), then fails with an *OverBudgetError
// whose Err matches context.DeadlineExceeded; with Options.DefaultWait negative it waits
// until it is served, ctx is cancelled or the governor closes.
//
// Every Reserve makes a new record: a Grant (and the Lease committed from
// it) names its own reservation for ever.
//
// Failures: memapi.ErrInvalidSize for 0 bytes; ErrUnknown (an unknown authority or
// holder); an *OverBudgetError of Kind memapi.ErrOverBudget and a Limit when the
// holder's limit forbids the bytes, and of Kind memapi.ErrOverBudget when the
// bytes exceed the capacity or the wait ended (its Err is then the context's
// error or context.DeadlineExceeded); memapi.ErrClosed after Close; the
// failure the Injector injects (Options.Injector). A failed Reserve leaves the ledger as
// it found it.
func (g *Governor) Reserve(ctx context.Context, r Request) (Grant, error) {
	if g.inject != nil {
		if err := g.injected(opReserve, r.Authority, r.Bytes); err != nil {
			return Grant{}, err
		}
	}
	if r.Bytes == 0 || r.Bytes > maxBytes {
		return Grant{}, opError(opReserve, memapi.ErrInvalidSize, r.Authority, r.Bytes, maxBytes, "")
	}
	if !r.Deadline.IsZero() && !g.clock.Now().Before(r.Deadline) {
		return Grant{}, &memapi.Error{Op: opReserve, Kind: memapi.ErrGrantClosed, Authority: r.Authority, Wanted: r.Bytes, Detail: "deadline already passed", Err: context.DeadlineExceeded}
	}
	a := (*g.auths.Load())[r.Authority]
	if a == nil {
		return Grant{}, opError(opReserve, errUnknownAuthority, r.Authority, r.Bytes, 0, "")
	}
	rec := &grant{a: a, size: r.Bytes} // made before the lock: the critical section books it
	a.mu.Lock()
	if a.shut != nil {
		a.mu.Unlock()
		return Grant{}, a.shut
	}
	c := a.accts[r.Holder]
	if c == nil {
		if c = a.newAccountLocked(r.Holder); c == nil {
			a.mu.Unlock()
			return Grant{}, opError(opReserve, errUnknownHolder, r.Authority, r.Bytes, 0, "holder "+string(r.Holder))
		}
	}
	if c.limit != 0 {
		if err := a.overLimitLocked(c, r.Bytes); err != nil {
			a.mu.Unlock()
			return Grant{}, err
		}
	}
	// The common case: nobody waits and the bytes fit (the free bytes are
	// the capacity less what is used: reserved, charged and pending).
	if f := &a.fig; a.head == nil && a.capacity-(f.reserved+f.charged+f.pending) >= r.Bytes {
		a.reserve(rec, c, r.Role, r.Deadline)
		a.mu.Unlock()
		return Grant{rec}, nil
	}
	var gr *grant
	var err error
	if a.admit != nil {
		gr, err = g.admitLocked(ctx, a, c, r.Role, r.Bytes, r.Priority, r.Deadline)
	} else {
		gr, err = g.queueLocked(ctx, a, c, r.Role, r.Bytes, r.Priority, r.Deadline)
	}
	return Grant{gr}, err
}

// reserve is the transition that books a reservation (see figures.go).
//
// It books gr, a new record (its authority and size set, not booked
// yet), as an open grant of c for role: its bytes leave free.
func (a *authority) reserve(gr *grant, c *account, role string, deadline time.Time) *grant {
	gr.acct = c
	gr.checks = a.g.inject != nil || !deadline.IsZero()
	for _, f := range gr.acct.books {
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

// overLimitLocked refuses bytes beyond c's holder limit (counted as an
// over-budget refusal), or returns nil.
func (a *authority) overLimitLocked(c *account, bytes memapi.Bytes) error {
	if c.limit == 0 || c.fig.used()+c.waiting+bytes <= c.limit {
		return nil
	}
	a.overBudget++
	return &OverBudgetError{Op: opReserve, Kind: errOverLimit, Authority: a.id, Holder: c.h.id,
		Reason: "over the holder's limit", Wanted: bytes, Limit: c.limit, HolderUse: c.fig.used() + c.waiting}
}

// queueLocked is the slow path of Reserve: the request fails at once
// or joins the queue, asks holders for the shortfall and waits.
func (g *Governor) queueLocked(ctx context.Context, a *authority, c *account, role string, bytes memapi.Bytes, priority int, deadline time.Time) (*grant, error) {
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
	var short memapi.Bytes
	if w.grant == nil {
		short = a.shortfallLocked(w)
	}
	if short != 0 {
		a.pressureEvents++
	}
	a.mu.Unlock()
	return g.wait(ctx, a, w, short)
}

// shortfallLocked is what the queue up to and including w lacks beyond the
// free bytes, the pending ones (already on their way back) and the bytes
// asked by tickets in flight.
func (a *authority) shortfallLocked(w *waiter) memapi.Bytes {
	need := a.aheadLocked(w) + w.bytes
	cover := a.freeLocked() + a.fig.pending + a.asking
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
	return &plannedTicket{
		Ticket: Ticket{ID: a.g.ticketSeq.Add(1), Authority: a.id, Wanted: want, Priority: w.priority, Deadline: w.deadline},
		acct:   best,
	}
}

// wait asks holders for w's shortfall, then waits for w to be served, and
// settles how it ended.
//
// Every callback it makes (the event hook, a holder's Reclaim) runs after
// the cleanup below is armed: should one panic, w leaves the queue (or its
// grant goes back) and no ask stays booked, then the panic goes on.
func (g *Governor) wait(ctx context.Context, a *authority, w *waiter, short memapi.Bytes) (*grant, error) {
	ended := false
	defer func() {
		if !ended {
			a.mu.Lock()
			a.abandonLocked(w)
			a.mu.Unlock()
		}
	}()
	if short != 0 {
		g.emit(Event{Kind: EventPressure, Authority: a.id, Holder: w.acct.h.id, Role: w.role, Bytes: short})
	}
	// With no deadline anywhere, the governor's default wait bounds the
	// wait (the grant keeps no deadline: only the wait is bounded).
	until, timeout := w.deadline, error(context.DeadlineExceeded)
	if _, ok := ctx.Deadline(); until.IsZero() && !ok && g.defaultWait > 0 {
		until, timeout = g.clock.Now().Add(g.defaultWait), errDefaultWait
	}
	// The holders' Reclaim runs under a context that ends with this wait
	// (served, failed or abandoned), not with the asking: a holder that
	// answered short may go on giving back while the reservation waits.
	// It is also what the wait waits under: until ends it with timeout as
	// the cause.
	hctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	if !until.IsZero() {
		if d := until.Sub(g.clock.Now()); d <= 0 {
			stop(timeout)
		} else {
			defer g.clock.AfterFunc(d, func() { stop(timeout) })()
		}
	}
	issued, freed := g.askHolders(hctx, a, w)
	cause := g.await(hctx, a, w)
	a.mu.Lock()
	ended = true
	switch {
	case w.err != nil:
		a.mu.Unlock()
		if ob, ok := w.err.(*OverBudgetError); ok {
			ob.Tickets, ob.Freed = issued, freed
			g.emit(Event{Kind: EventOverBudget, Authority: a.id, Holder: w.acct.h.id, Role: w.role, Bytes: w.bytes, Err: ob})
		}
		return nil, w.err
	case w.grant != nil && cause == nil:
		a.mu.Unlock()
		ended = false // a hook that panics here would strand the grant: it goes back
		g.emit(Event{Kind: EventServed, Authority: a.id, Holder: w.acct.h.id, Role: w.role, Bytes: w.bytes})
		ended = true
		return w.grant, nil
	}
	ahead := a.abandonLocked(w)
	a.cancelled++
	reason := "not served before the wait ended"
	if cause == errDefaultWait {
		reason = "not served within the governor's default wait of " + g.defaultWait.String() + " (the reservation had no deadline)"
	}
	err := a.overBudgetLocked(w, ahead, reason, cause)
	err.Tickets, err.Freed = issued, freed
	a.mu.Unlock()
	g.emit(Event{Kind: EventOverBudget, Authority: a.id, Holder: w.acct.h.id, Role: w.role, Bytes: w.bytes, Err: err})
	return nil, err
}

// askHolders hands w's shortfall to holders, one ticket at a time (so a
// holder that frees less than asked, or fails, is followed by the next
// one), until nothing is short, no holder can give more, or the wait ends
// (ctx: the wait's, ended by the reservation's context, its deadline with
// its timeout as the cause, or the wait's end). A holder's Reclaim answers
// for this reservation under ctx, so a Reclaim that waits on it never
// keeps Reserve waiting past the wait. It returns the tickets issued and
// the bytes their holders reported freeing.
func (g *Governor) askHolders(ctx context.Context, a *authority, w *waiter) (issued int, freed memapi.Bytes) {
	var asked []*account
	for ctx.Err() == nil {
		a.mu.Lock()
		t := a.nextTicketLocked(w, asked)
		a.mu.Unlock()
		if t == nil {
			break
		}
		asked = append(asked, t.acct)
		freed += g.reclaim(ctx, a, t)
		issued++
	}
	return issued, freed
}

// reclaim hands ticket t to its holder, books the answer and returns the
// bytes the holder reported freeing. Should the
// Reclaim (or the event hook) panic, the ask is taken back first.
func (g *Governor) reclaim(ctx context.Context, a *authority, t *plannedTicket) memapi.Bytes {
	h := t.acct.h
	answered := false
	defer func() {
		if !answered {
			a.mu.Lock()
			t.acct.asking -= t.Wanted
			a.asking -= t.Wanted
			a.mu.Unlock()
		}
	}()
	g.emit(Event{Kind: EventTicket, Authority: a.id, Holder: h.id, Ticket: t.Ticket, Bytes: t.Wanted})
	n, err := h.reclaimer.Reclaim(ctx, t.Ticket)
	answered = true
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
	a.mu.Unlock()
	if err != nil {
		g.log.Debug("governor: reclaim failed", "authority", a.id, "holder", h.id, "ticket", t.ID, "err", err)
	}
	g.emit(Event{Kind: EventReclaimed, Authority: a.id, Holder: h.id, Ticket: t.Ticket, Bytes: n, Err: err})
	return n
}

// await blocks until w is served or failed, or ctx ends (the wait's:
// wait); it returns the cause of a wait that ended unserved (nil when
// served).
func (g *Governor) await(ctx context.Context, a *authority, w *waiter) error {
	if !isClosed(w.ready) {
		g.emit(Event{Kind: EventWaiting, Authority: a.id, Holder: w.acct.h.id, Role: w.role, Bytes: w.bytes})
	}
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
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
		if gr := w.grant; gr.state == stateOpen {
			a.cancel(gr)
			a.granted--
		}
		return 0
	}
	ahead := a.aheadLocked(w)
	wasHead := a.head == w
	a.removeLocked(w)
	if wasHead {
		a.serve() // the next in line may fit now
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
