package xproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// PressureHolder is the holder an Authority registers in its governor to
// answer other processes' pressure: its reservations, made with the asking
// process's priority, issue this process's tickets.
const PressureHolder governor.HolderID = "xproc.pressure"

// Authority is a governor authority whose capacity is this process's claim
// on the shared ledger: the local governor keeps its holders, grants,
// leases and tickets as always, and the ledger only ever sees the claim
// (the bytes this process may use) and the settled figures.
//
// A reservation that does not fit the local free bytes first claims the
// shortfall from the ledger, atomically across processes under the file
// lock, and only then reserves locally: so the sum of the claims never
// exceeds the shared capacity, each process's reserved + charged + pending
// never exceeds its claim, and no process installs bytes another process's
// grant covers. A claim that does not fit fails with an
// *governor.OverBudgetError before any mechanism is called.
//
// Every reservation on the authority goes through Reserve: a direct
// governor.Reserve on it sees only the bytes already claimed.
type Authority struct {
	l  *Ledger
	g  *governor.Governor
	id memapi.AuthorityID

	// mu orders this process's claims, capacity changes and settles:
	// between a claim and the local reservation it is for, nothing else
	// reserves or trims, so the claimed bytes are that reservation's.
	mu       sync.Mutex
	released bool
	seenWant uint64
}

// Bind adds authority id to g with capacity 0 and ties it to the ledger.
// A ledger binds one authority.
func (l *Ledger) Bind(g *governor.Governor, id memapi.AuthorityID) (*Authority, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, &LedgerError{Op: "xproc.Bind", Path: l.path, Err: ErrClosed}
	}
	if old := l.auth.Load(); old != nil {
		return nil, ledgerErr("xproc.Bind", l.path, ErrInUse, "already bound to authority %s", old.id)
	}
	if err := g.AddAuthority(id, 0); err != nil {
		return nil, err
	}
	if err := g.Register(PressureHolder, nil, governor.HolderOptions{}); err != nil && !errors.Is(err, governor.ErrDuplicate) {
		_ = g.RemoveAuthority(id)
		return nil, err
	}
	a := &Authority{l: l, g: g, id: id}
	l.auth.Store(a)
	return a, nil
}

// ID returns the local authority's ID.
func (a *Authority) ID() memapi.AuthorityID { return a.id }

// Reserve is governor.Reserve on the shared authority. When the local free
// bytes do not cover bytes, the shortfall is claimed from the ledger
// first; when the ledger cannot give it, a reservation that may wait (ctx
// can end, or deadline is set) posts the want, which every process's
// watcher answers with tickets to its holders, and retries until ctx ends
// or the deadline passes; one that may not wait fails at once. Either way
// the failure is an *governor.OverBudgetError of Kind memapi.ErrOverBudget
// with the shared figures, and no physical allocation was attempted.
func (a *Authority) Reserve(ctx context.Context, holder governor.HolderID, role governor.Role, bytes memapi.Bytes, priority governor.Priority, deadline time.Time) (*governor.Grant, error) {
	var dl <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		dl = t.C
	}
	if bytes == 0 || uint64(bytes) > maxBytes {
		// No claim can serve it: the governor's typed error, the ledger untouched.
		return a.g.Reserve(ctx, a.id, holder, role, bytes, priority, deadline)
	}
	wait := ctx.Done() != nil || !deadline.IsZero()
	a.mu.Lock()
	for {
		err := a.claimFor(holder, bytes, priority, wait)
		if err == nil {
			break
		}
		if !wait || !errors.Is(err, memapi.ErrOverBudget) {
			a.mu.Unlock()
			return nil, err
		}
		a.mu.Unlock()
		t := time.NewTimer(a.l.poll / 10)
		select {
		case <-ctx.Done():
			t.Stop()
			a.clearWant()
			return nil, withCause(err, ctx.Err())
		case <-dl:
			t.Stop()
			a.clearWant()
			return nil, withCause(err, context.DeadlineExceeded)
		case <-t.C:
		}
		a.mu.Lock()
	}
	defer a.mu.Unlock()
	gr, err := a.g.Reserve(ctx, a.id, holder, role, bytes, priority, deadline)
	if err != nil {
		// An unknown holder, a holder's limit: what was claimed for the
		// reservation goes back at once, so a failed Reserve leaves the
		// ledger holding no more than it did.
		_ = a.trimLocked()
		return nil, err
	}
	a.clearWantLocked()
	return gr, nil
}

func withCause(err, cause error) error {
	var ob *governor.OverBudgetError
	if errors.As(err, &ob) {
		ob.Err = cause
	}
	return err
}

// claimFor makes the local free bytes cover bytes, claiming the shortfall
// from the ledger; a reservation that will wait posts its want when the
// ledger cannot give it. Called with a.mu held.
func (a *Authority) claimFor(holder governor.HolderID, bytes memapi.Bytes, priority governor.Priority, wait bool) error {
	if a.released {
		return &LedgerError{Op: "xproc.Reserve", Path: a.l.path, Err: ErrClosed}
	}
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &LedgerError{Op: "xproc.Reserve", Path: a.l.path, Err: ErrClosed, Detail: "the local authority was removed"}
	}
	if snap.Free >= bytes || snap.Waiters != 0 {
		return nil // the local governor decides (and queues behind its waiters)
	}
	need := uint64(bytes - snap.Free)
	l := a.l
	if err := l.lock(); err != nil {
		return err
	}
	free := l.freeLocked()
	var ev []Event
	if need > free {
		// A stale slot must not refuse a live process: reclaim the dead first.
		ev = l.scanLocked()
		free = l.freeLocked()
	}
	if need > free {
		e := &governor.OverBudgetError{
			Op: "xproc.Reserve", Kind: memapi.ErrOverBudget, Authority: a.id, Holder: holder,
			Reason:   fmt.Sprintf("the shared ledger %s has %d bytes unclaimed, %d short", l.path, free, need-free),
			Wanted:   bytes,
			Free:     snap.Free + memapi.Bytes(free),
			Capacity: memapi.Bytes(l.load(l.hw(hCapacity))),
			Reserved: memapi.Bytes(l.load(l.hw(hReserved))),
			Charged:  memapi.Bytes(l.load(l.hw(hCharged))),
			Pending:  memapi.Bytes(l.load(l.hw(hPending))),
		}
		if wait && l.load(l.hw(hWant)) < need-free {
			l.store(l.hw(hWant), need-free)
			l.store(l.hw(hWantPri), uint64(int64(priority)))
			l.add(l.hw(hWantSeq), 1)
		}
		l.unlock()
		l.emitAll(ev)
		return e
	}
	claim := l.load(l.sw(l.slot, sClaim)) + need
	l.begin()
	l.store(l.sw(l.slot, sClaim), claim)
	l.add(l.hw(hClaimed), need)
	l.end()
	l.unlock()
	l.emitAll(ev)
	if err := a.g.SetCapacity(a.id, memapi.Bytes(claim)); err != nil {
		// Growing a live authority does not fail; if it did, the claim
		// goes back so the ledger never counts bytes nobody can use.
		_ = l.lock()
		l.begin()
		l.store(l.sw(l.slot, sClaim), claim-need)
		l.add(l.hw(hClaimed), -need)
		l.end()
		l.unlock()
		return err
	}
	return nil
}

// freeLocked is the shared capacity not claimed (0 while a lowered
// capacity is below the claims).
func (l *Ledger) freeLocked() uint64 {
	c, u := l.load(l.hw(hCapacity)), l.load(l.hw(hClaimed))
	if u >= c {
		return 0
	}
	return c - u
}

func (a *Authority) clearWant() {
	a.mu.Lock()
	a.clearWantLocked()
	a.mu.Unlock()
}

// clearWantLocked withdraws a posted want once served or given up. (A want
// another process posted since is cleared too; that process posts it again
// on its next try.)
func (a *Authority) clearWantLocked() {
	l := a.l
	if l.load(l.hw(hWant)) == 0 {
		return
	}
	if l.lock() == nil {
		l.store(l.hw(hWant), 0)
		l.unlock()
	}
}

// Settle publishes the local figures into this process's slot and gives
// the claimed bytes it does not use back to the ledger. The watcher calls
// it every Poll; call it after freeing memory to hand the bytes to other
// processes at once.
// It fails with ErrClosed after Close, and with the ledger's error when
// the file cannot be locked (then nothing was given back).
func (a *Authority) Settle() error { return a.settle() }

// settle is Settle; it also answers another process's want with tickets
// to this process's holders (answerLocked). While the holders are asked
// (at most one Poll) this process's reservations wait for a.mu.
func (a *Authority) settle() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.released {
		return &LedgerError{Op: "xproc.Settle", Path: a.l.path, Err: ErrClosed}
	}
	a.answerLocked()
	return a.trimLocked()
}

// trimLocked gives the spare claim back and publishes the figures.
func (a *Authority) trimLocked() error {
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &LedgerError{Op: "xproc.Settle", Path: a.l.path, Err: ErrClosed, Detail: "the local authority was removed"}
	}
	spare := snap.Free
	if snap.Waiters != 0 {
		spare = 0 // the local waiters are owed these bytes
	}
	if spare != 0 && a.g.SetCapacity(a.id, snap.Capacity-spare) != nil {
		spare = 0
	}
	l := a.l
	if err := l.lock(); err != nil {
		if spare != 0 {
			// Keep the local capacity equal to the claim.
			_ = a.g.SetCapacity(a.id, snap.Capacity)
		}
		return err
	}
	defer l.unlock()
	// The slot uses no more than it claims after every single store, so
	// a process that dies here leaves a slot Parse accepts: the figures
	// that fall first, then those that rise (every mix is at most the old
	// or the new use, both within the old claim), then the claim shrinks
	// to the new use.
	l.begin()
	figs := []struct {
		slot, total int
		v           uint64
	}{{sReserved, hReserved, uint64(snap.Reserved)}, {sCharged, hCharged, uint64(snap.Charged)}, {sPending, hPending, uint64(snap.Pending)}}
	for _, rise := range []bool{false, true} {
		for _, f := range figs {
			old := l.load(l.sw(l.slot, f.slot))
			if (f.v > old) != rise || f.v == old {
				continue
			}
			l.store(l.sw(l.slot, f.slot), f.v)
			l.add(l.hw(f.total), f.v-old)
		}
	}
	l.store(l.sw(l.slot, sClaim), uint64(snap.Capacity-spare))
	l.add(l.hw(hClaimed), -uint64(spare))
	l.add(l.sw(l.slot, sSeq), 1)
	l.end()
	return nil
}

// answerLocked turns a want posted since the last settle into pressure on
// this process's holders: a reservation by PressureHolder of the bytes
// wanted (at most this authority's capacity), with the asking process's
// priority, for one Poll. The governor then issues tickets exactly as for
// a local shortfall (lower holder priority first, guarantees never asked),
// and the bytes the holders free are trimmed back to the ledger, where the
// asking process claims them.
func (a *Authority) answerLocked() {
	l := a.l
	seq, want := l.load(l.hw(hWantSeq)), l.load(l.hw(hWant))
	if seq == a.seenWant || want == 0 {
		return
	}
	a.seenWant = seq
	snap, ok := a.g.Authority(a.id)
	if !ok || snap.Reclaimable == 0 || snap.Capacity == 0 {
		return
	}
	n := min(memapi.Bytes(want), snap.Reclaimable, snap.Capacity)
	pri := governor.Priority(int64(l.load(l.hw(hWantPri))))
	ctx, cancel := context.WithTimeout(context.Background(), l.poll)
	defer cancel()
	if gr, err := a.g.Reserve(ctx, a.id, PressureHolder, "xproc.pressure", n, pri, time.Time{}); err == nil {
		_ = gr.Cancel()
	}
}

// release empties the claim and removes the local authority, for Close. It
// fails with ErrInUse while the authority holds bytes.
func (a *Authority) release() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.released {
		return nil
	}
	if err := a.trimLocked(); err != nil {
		a.released = true
		return err
	}
	snap, ok := a.g.Authority(a.id)
	if ok && (snap.Capacity != 0 || snap.Grants != 0) {
		return ledgerErr("xproc.Close", a.l.path, ErrInUse, "authority %s holds %d reserved, %d charged, %d pending", a.id, snap.Reserved, snap.Charged, snap.Pending)
	}
	if ok {
		if err := a.g.RemoveAuthority(a.id); err != nil {
			return err
		}
	}
	a.released = true
	return nil
}
