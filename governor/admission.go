package governor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Admission raises an authority's capacity when a reservation does not fit
// it: a capacity that is itself a share of something larger (a claim on a
// ledger several processes share, package governor/xproc) grows by the
// shortfall before the reservation queues. It is installed on one authority
// with SetAdmission and is called by every reservation on it, whatever API
// it comes through (Reserve, and so every manager above the governor),
// only when the reservation does not fit and the governor holds no lock: Admit
// may block, take its own locks and call SetCapacity and Authority.
type Admission interface {
	// Admit tries to raise the capacity (with SetCapacity) by need bytes
	// for a reservation of bytes by holder with priority: the shortfall of
	// the queue ahead and of the reservation beyond the free bytes, as the
	// governor saw it before it released its lock. An Admission that
	// orders its claims under a lock of its own may recompute the
	// shortfall there from Authority's Free and WaitingBytes (which may
	// have moved since) and raise the capacity by that, or not at all when
	// nothing is short any more. wait says
	// whether the reservation may wait (its ctx can end, or it has a
	// deadline). It returns nil once the capacity grew, or the reason it
	// could not: an *OverBudgetError is the reservation's error when it may
	// not wait or exceeds the error's Capacity (then no capacity can ever
	// serve it); otherwise the reservation queues, even beyond the local
	// capacity, and it is the Admission's to raise the capacity for the
	// waiting reservations later (Snapshot's Waiters and WaitingBytes).
	// An error that matches memapi.ErrUnavailable declines the
	// reservation (one made by the Admission's own holder, say): it
	// proceeds as on an authority without one. Any other error ends the
	// reservation with it.
	Admit(ctx context.Context, holder HolderID, bytes, need memapi.Bytes, priority int, wait bool) error
}

// SetAdmission installs adm on authority (nil removes it). It fails with
// ErrUnknown.
func (g *Governor) SetAdmission(authority memapi.AuthorityID, adm Admission) error {
	a := g.authority(authority)
	if a == nil {
		return opError("governor.SetAdmission", errUnknownAuthority, authority, 0, 0, "")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.shut != nil {
		return opError("governor.SetAdmission", errUnknownAuthority, authority, 0, 0, "")
	}
	a.admit = adm
	return nil
}

// admissionReturn is an Admission that takes back capacity it raised for a
// reservation that then failed before it was granted (its holder's limit,
// the holder unregistered, its context ended, its tries ran out): the
// bytes would otherwise stay spare, a share of something larger held for
// nothing, until the Admission next trims. The governor calls
// ReturnAdmitted without its lock, once, for a failed reservation of bytes
// for which Admit returned nil at least once; the Admission gives back up
// to bytes of the capacity that is still free (what it raised beyond the
// reservation's own bytes went to the waiters ahead, and bytes other
// reservations took meanwhile are theirs).
type admissionReturn interface {
	ReturnAdmitted(holder HolderID, bytes memapi.Bytes)
}

// errAdmissionContended is the cause inside the *OverBudgetError of a
// reservation that may not wait after maxAdmitTries admissions whose
// capacity other reservations took each time before it tried again.
var errAdmissionContended = errors.New("governor: the capacity admitted for the reservation went to other reservations every time")

// maxAdmitTries bounds the admissions one reservation asks for: past it, a
// reservation that may wait queues (served in arrival order from then on)
// and one that may not fails with errAdmissionContended.
const maxAdmitTries = 8

// admitLocked is the slow path of Reserve for a reservation that does not fit an
// authority with an Admission, called with a.mu held (it releases it): the
// Admission raises the capacity by the shortfall, outside the lock, and the
// reservation tries again, at most maxAdmitTries times and while its ctx
// lasts; once the Admission cannot, it queues as on any authority, or
// fails with the Admission's error when it may not wait. A reservation that
// fails after an admission gives the admitted bytes back (admissionReturn).
func (g *Governor) admitLocked(ctx context.Context, a *authority, c *account, role string, bytes memapi.Bytes, priority int, deadline time.Time) (*grant, error) {
	adm := a.admit
	wait := ctx.Done() != nil || !deadline.IsZero()
	// The reservation's deadline bounds the Admission's waits as its ctx
	// does (measured on the governor's clock); with no deadline anywhere,
	// the governor's default wait bounds them, as it bounds a queued wait.
	actx := ctx
	until, cause := deadline, error(context.DeadlineExceeded)
	if _, ok := ctx.Deadline(); until.IsZero() && !ok && g.defaultWait > 0 {
		until, cause = g.clock.Now().Add(g.defaultWait), errDefaultWait
	}
	if !until.IsZero() {
		if d, ok := ctx.Deadline(); !ok || d.After(until) {
			c, stop := context.WithCancelCause(ctx)
			stopTimer := g.clock.AfterFunc(until.Sub(g.clock.Now()), func() { stop(cause) })
			defer stopTimer()
			defer stop(nil)
			actx = c
		}
	}
	admitted := false // Admit returned nil for this reservation
	// fail ends the reservation with err, emitting an EventOverBudget when
	// asked, and gives the admitted bytes back; called with a.mu held.
	fail := func(err error, event bool) (*grant, error) {
		a.mu.Unlock()
		if r, ok := adm.(admissionReturn); ok && admitted {
			r.ReturnAdmitted(c.h.id, bytes)
		}
		if event {
			g.emit(Event{Kind: EventOverBudget, Authority: a.id, Holder: c.h.id, Role: role, Bytes: bytes, Err: err})
		}
		return nil, err
	}
	for tries := 0; ; tries++ {
		// The shortfall: the queue ahead is served first, so it lacks the
		// waiters' bytes and its own beyond the free ones, and nothing
		// when the free bytes cover them all.
		need, free := a.waitingBytes+bytes, a.freeLocked()
		if need <= free {
			a.serve()
			if a.head == nil && a.freeLocked() >= bytes {
				gr := a.reserve(&grant{a: a, size: bytes}, c, role, deadline)
				a.mu.Unlock()
				return gr, nil
			}
			break
		}
		need -= free
		if actx.Err() != nil {
			w := &waiter{acct: c, bytes: bytes}
			return fail(a.overBudgetLocked(w, a.waitingBytes, "the context ended before the admission raised enough capacity", context.Cause(actx)), true)
		}
		if tries == maxAdmitTries {
			if wait {
				break // queue: served in arrival order from here on
			}
			w := &waiter{acct: c, bytes: bytes}
			return fail(a.overBudgetLocked(w, a.waitingBytes, fmt.Sprintf("other reservations took the capacity admitted for it %d times", maxAdmitTries), errAdmissionContended), true)
		}
		err := g.admitCall(actx, a, adm, c, bytes, need, priority, wait, admitted)
		admitted = admitted || err == nil
		if a.shut != nil {
			return fail(a.shut, false)
		}
		if c.gone {
			return fail(opError(opReserve, errUnknownHolder, a.id, bytes, 0, "holder "+string(c.h.id)), false)
		}
		// The holder's other reservations may have grown meanwhile.
		if err := a.overLimitLocked(c, bytes); err != nil {
			return fail(err, false)
		}
		if a.head == nil && a.freeLocked() >= bytes {
			gr := a.reserve(&grant{a: a, size: bytes}, c, role, deadline)
			a.mu.Unlock()
			return gr, nil
		}
		if err == nil {
			continue // the bytes went to another reservation meanwhile: claim again
		}
		if errors.Is(err, memapi.ErrUnavailable) {
			break
		}
		var ob *OverBudgetError
		if !errors.As(err, &ob) {
			return fail(err, false)
		}
		if !wait || bytes > ob.Capacity {
			a.overBudget++
			return fail(err, true)
		}
		break
	}
	return g.queueLocked(ctx, a, c, role, bytes, priority, deadline)
}

// admitCall calls adm.Admit without a.mu (held on entry and on return).
// Its bookkeeping is deferred: should Admit panic (or end its goroutine),
// the lock is not taken again, the capacity admitted by earlier calls for
// this reservation goes back (admissionReturn, when admitted) so the
// ledger is as it was, and the panic goes on, as a panicking Reclaim's or
// event hook's does.
func (g *Governor) admitCall(ctx context.Context, a *authority, adm Admission, c *account, bytes, need memapi.Bytes, priority int, wait, admitted bool) error {
	a.mu.Unlock()
	returned := false
	defer func() {
		if returned {
			a.mu.Lock()
			return
		}
		g.log.Debug("governor: Admit did not return", "authority", a.id, "holder", c.h.id, "bytes", bytes)
		if r, ok := adm.(admissionReturn); ok && admitted {
			r.ReturnAdmitted(c.h.id, bytes)
		}
	}()
	err := adm.Admit(ctx, c.h.id, bytes, need, priority, wait)
	returned = true
	return err
}
