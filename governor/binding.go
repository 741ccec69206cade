package governor

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

const opReserveInto = "governor.Binding.ReserveInto"

// Binding is one holder's reservation path on one authority for one role,
// resolved once by Governor.Bind. Its Reserve is Governor.Reserve without
// the lookups of the authority and of the holder's account, and its
// ReserveInto also skips the allocation of the grant: the hot path of a
// holder that reserves often (a KV store's pages, an allocator's chunks).
//
// A Binding follows its names: after the holder is unregistered and
// registered again, or the authority removed and added again, it resolves
// them anew on its next use; until then it fails as Reserve would.
//
// All methods are safe for concurrent use.
type Binding struct {
	g         *Governor
	authority memapi.AuthorityID
	holder    HolderID
	role      Role
	to        atomic.Pointer[bindTarget]
}

type bindTarget struct {
	a *authority
	c *account
}

// Bind resolves holder's account on authority for reservations of role. It
// fails with ErrUnknownAuthority, ErrUnknownHolder, or memapi.ErrClosed after
// Close. It creates the holder's account on the authority (shown, with its
// figures at zero, in snapshots) if no reservation did yet.
func (g *Governor) Bind(authority memapi.AuthorityID, holder HolderID, role Role) (*Binding, error) {
	b := &Binding{g: g, authority: authority, holder: holder, role: role}
	a, _, err := b.resolve()
	if err != nil {
		return nil, err
	}
	a.mu.Unlock()
	return b, nil
}

// Authority returns the authority the binding reserves on.
func (b *Binding) Authority() memapi.AuthorityID { return b.authority }

// Holder returns the holder the binding reserves for.
func (b *Binding) Holder() HolderID { return b.holder }

// Role returns the role of the binding's reservations.
func (b *Binding) Role() Role { return b.role }

// Reserve is Governor.Reserve(ctx, b.Authority(), b.Holder(), b.Role(),
// bytes, priority, deadline): the same grant, waits, pressure tickets and
// errors. With no deadline, neither deadline nor ctx's, it waits at most
// the governor's Options.DefaultWait (30 s unless set), then fails with
// ErrDefaultWait as its cause.
func (b *Binding) Reserve(ctx context.Context, bytes memapi.Bytes, priority Priority, deadline time.Time) (*Grant, error) {
	if err := b.g.checkReserve(b.authority, bytes, deadline); err != nil {
		return nil, err
	}
	a, c, err := b.lock()
	if err != nil {
		return nil, err
	}
	return b.g.reserveLocked(ctx, a, c, b.role, bytes, priority, deadline, nil)
}

// ReserveInto is Reserve into a grant the caller owns instead of a new one,
// so the reservation allocates nothing when it does not wait. gr must be a
// zero Grant or one this binding's authority made whose use has ended:
// cancelled, committed with its lease empty (refunded or released), or
// reclaimed after its deadline with nothing drawn. Otherwise ReserveInto
// fails with memapi.ErrInUse, or memapi.ErrAuthorityMismatch for a grant of
// another authority, and changes nothing.
//
// Reusing gr ends the previous grant and its lease: the *Lease its Commit
// returned is the new grant's lease from then on, so the caller must hold no
// other reference to either and must not use gr while ReserveInto runs.
// While the reservation waits, gr is closed to every use; a failed
// ReserveInto leaves it closed and reusable.
func (b *Binding) ReserveInto(ctx context.Context, gr *Grant, bytes memapi.Bytes, priority Priority, deadline time.Time) error {
	if gr == nil {
		return opError(opReserveInto, memapi.ErrNilHandle, b.authority, bytes, 0, "nil grant")
	}
	// The same reservation again, right after the whole refund of the last
	// one's lease: the bytes never left, so the grant opens again without
	// the lock (Grant.reissue), or the swap fails and the lock decides.
	if t := b.to.Load(); t != nil && gr.acct == t.c && bytes == gr.sz() && priority == gr.priority &&
		gr.role == b.role && deadline.IsZero() && !t.a.closed.Load() && gr.reissue() {
		return nil
	}
	if bytes == 0 || bytes > maxBytes || !deadline.IsZero() {
		if err := b.g.checkReserve(b.authority, bytes, deadline); err != nil {
			return err
		}
	}
	// The hot path, spelled out: the bound authority, and a grant whose
	// lease was just refunded whole (see reusableLocked).
	var a *authority
	var c *account
	if t := b.to.Load(); t != nil {
		t.a.mu.Lock()
		if t.a.shut == nil && !t.c.gone {
			a, c = t.a, t.c
		} else {
			t.a.mu.Unlock()
		}
	}
	if a == nil {
		var err error
		if a, c, err = b.resolve(); err != nil {
			return err
		}
	}
	if _, st, _ := gr.load(); gr.acct == nil || gr.acct.a != a || st != stateRefunded {
		if err := a.reusableLocked(gr); err != nil {
			a.mu.Unlock()
			return err
		}
	}
	_, err := b.g.reserveLocked(ctx, a, c, b.role, bytes, priority, deadline, gr)
	return err
}

// lock takes the bound authority's mutex, resolving the binding again when
// the authority or the account it holds went away.
func (b *Binding) lock() (*authority, *account, error) {
	if t := b.to.Load(); t != nil {
		t.a.mu.Lock()
		if t.a.shut == nil && !t.c.gone {
			return t.a, t.c, nil
		}
		t.a.mu.Unlock()
	}
	return b.resolve()
}

// resolve looks the authority and the holder's account up as Reserve does
// and keeps them; it returns with the authority's mutex held on success.
func (b *Binding) resolve() (*authority, *account, error) {
	a := b.g.authority(b.authority)
	if a == nil {
		return nil, nil, opError(opReserve, ErrUnknownAuthority, b.authority, 0, 0, "")
	}
	a.mu.Lock()
	if a.shut != nil {
		a.mu.Unlock()
		return nil, nil, a.shut
	}
	c := a.accountLocked(b.holder)
	if c == nil {
		a.mu.Unlock()
		return nil, nil, opError(opReserve, ErrUnknownHolder, b.authority, 0, 0, "holder "+string(b.holder))
	}
	b.to.Store(&bindTarget{a: a, c: c})
	return a, c, nil
}

// reusableLocked checks that gr can be filled by a reservation on a.
func (a *authority) reusableLocked(gr *Grant) error {
	if gr.acct == nil {
		return nil // a zero Grant
	}
	if gr.copied() {
		return gr.closedError(opReserveInto, stateCopied)
	}
	if gr.acct.a != a {
		return opError(opReserveInto, memapi.ErrAuthorityMismatch, a.id, 0, 0, "grant of authority "+string(gr.acct.a.id))
	}
	_, st, d := gr.load()
	switch {
	case st == stateClaimed:
		return opError(opReserveInto, memapi.ErrInUse, a.id, 0, 0, "grant held by a waiting reservation")
	case st == stateOpen:
		return opError(opReserveInto, memapi.ErrInUse, a.id, gr.sz(), 0, "grant still open")
	case st == stateRefunded:
		// Its lease is empty. Still unsettled, it is issued again in
		// place (newGrantLocked); a reservation that waits settles it
		// before it takes the grant.
	case st == stateCommit || st == stateSettled:
		a.settleGrantLocked(gr)
		if held := gr.lease.charged + gr.lease.pending; held != 0 {
			return opError(opReserveInto, memapi.ErrInUse, a.id, held, 0, "its lease still holds bytes")
		}
	case st == stateExpired && d != 0:
		return opError(opReserveInto, memapi.ErrInUse, a.id, d, 0, "drawn bytes of the expired grant not undrawn")
	}
	return nil
}
