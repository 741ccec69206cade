package xproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
// Every reservation on the bound authority claims so, whatever API it
// comes through (governor.Governor.Reserve, governor.Binding.Reserve and
// ReserveInto, and so pmm): Bind installs the Authority as the local
// authority's governor.Admission.
type Authority struct {
	l  *Ledger
	g  *governor.Governor
	id memapi.AuthorityID

	// mu orders this process's claims, capacity changes and settles:
	// between a claim and the local reservation it is for, nothing else
	// reserves or trims, so the claimed bytes are that reservation's.
	mu       sync.Mutex
	released atomic.Bool // set once under mu; read without it by Reserve
	seenWant uint64
	wanted   bool              // a want this process posted may still stand
	wantPri  governor.Priority // the priority it was posted with

	beforeClaim func(bytes memapi.Bytes) // tests only, set before use: runs in Admit before a.mu is taken
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
	if err := g.SetAdmission(id, a); err != nil {
		_ = g.RemoveAuthority(id)
		return nil, err
	}
	l.auth.Store(a)
	return a, nil
}

// ID returns the local authority's ID.
func (a *Authority) ID() memapi.AuthorityID { return a.id }

// Reserve is governor.Reserve on the shared authority, kept for callers
// that hold the Authority: every reservation on the bound authority, made
// through Reserve, governor.Governor.Reserve, governor.Binding.Reserve or
// ReserveInto (and so pmm), claims from the ledger the same way (Admit).
// When the local free bytes do not cover bytes, the shortfall is claimed
// from the ledger first; when the ledger cannot give it, a reservation that
// may wait (ctx can end, or deadline is set) posts the want, which every
// process's watcher answers with tickets to its holders, and queues
// locally: the watcher claims for the local waiters every Poll until they
// are served or give up. One that may not wait fails at once. Either way
// the failure is an *governor.OverBudgetError of Kind memapi.ErrOverBudget
// and no physical allocation was attempted.
func (a *Authority) Reserve(ctx context.Context, holder governor.HolderID, role governor.Role, bytes memapi.Bytes, priority governor.Priority, deadline time.Time) (*governor.Grant, error) {
	if a.released.Load() {
		return nil, &LedgerError{Op: "xproc.Reserve", Path: a.l.path, Err: ErrClosed}
	}
	return a.g.Reserve(ctx, a.id, holder, role, bytes, priority, deadline)
}

// Admit is the governor's admission hook on the bound authority
// (governor.Admission): it claims the shortfall from the ledger and raises
// the local capacity to the new claim, both under a.mu, so a settle never
// gives back a claim the capacity does not show yet. The shortfall is
// computed under a.mu (the waiting bytes and the reservation's beyond the
// local free ones), not taken from the governor's need, which a settle
// claiming for the waiters meanwhile would make stale: the claims are never
// more than what the reservations ahead and this one lack. The governor calls it
// without its own lock when a reservation does not fit; PressureHolder's
// reservations (answers to another process's want) never claim.
func (a *Authority) Admit(_ context.Context, holder governor.HolderID, bytes, _ memapi.Bytes, priority governor.Priority, wait bool) error {
	if holder == PressureHolder {
		return governor.ErrNoAdmission
	}
	if a.beforeClaim != nil {
		a.beforeClaim(bytes)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// The governor's need is the shortfall it saw before it released its
	// lock; a settle may have claimed for the waiters ahead (and served
	// them) since. Claim the shortfall as it is now, under a.mu, which
	// orders every claim of this process: the bytes the waiters ahead and
	// this reservation lack beyond the local free ones.
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &LedgerError{Op: "xproc.Reserve", Path: a.l.path, Err: ErrClosed, Detail: "the local authority was removed"}
	}
	if snap.WaitingBytes+bytes <= snap.Free {
		return nil // nothing is short any more: the governor tries again
	}
	return a.claimLocked(holder, bytes, snap.WaitingBytes+bytes-snap.Free, priority, wait)
}

// claimLocked claims need more bytes from the ledger for a reservation of
// bytes and raises the local capacity to the claim; a reservation that will
// wait posts its want when the ledger cannot give it. Called with a.mu held.
func (a *Authority) claimLocked(holder governor.HolderID, bytes, need memapi.Bytes, priority governor.Priority, wait bool) error {
	if a.released.Load() {
		return &LedgerError{Op: "xproc.Reserve", Path: a.l.path, Err: ErrClosed}
	}
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &LedgerError{Op: "xproc.Reserve", Path: a.l.path, Err: ErrClosed, Detail: "the local authority was removed"}
	}
	l := a.l
	if uint64(need) > maxBytes {
		return &governor.OverBudgetError{Op: "xproc.Reserve", Kind: memapi.ErrOverBudget, Authority: a.id, Holder: holder,
			Reason: "beyond any shared capacity", Wanted: bytes, Free: snap.Free}
	}
	if err := l.lock(); err != nil {
		return err
	}
	free := l.freeLocked()
	var ev []Event
	if uint64(need) > free {
		// A stale slot must not refuse a live process: reclaim the dead first.
		ev = l.scanLocked()
		free = l.freeLocked()
	}
	if uint64(need) > free {
		e := &governor.OverBudgetError{
			Op: "xproc.Reserve", Kind: memapi.ErrOverBudget, Authority: a.id, Holder: holder,
			Reason:   fmt.Sprintf("the shared ledger %s has %d bytes unclaimed, %d short", l.path, free, uint64(need)-free),
			Wanted:   bytes,
			Free:     snap.Free + memapi.Bytes(free),
			Capacity: memapi.Bytes(l.load(l.hw(hCapacity))),
			Reserved: memapi.Bytes(l.load(l.hw(hReserved))),
			Charged:  memapi.Bytes(l.load(l.hw(hCharged))),
			Pending:  memapi.Bytes(l.load(l.hw(hPending))),
		}
		if wait {
			a.wanted, a.wantPri = true, priority
			if l.load(l.hw(hWant)) < uint64(need)-free {
				l.store(l.hw(hWant), uint64(need)-free)
				l.store(l.hw(hWantPri), uint64(int64(priority)))
				l.add(l.hw(hWantSeq), 1)
			}
		}
		l.unlock()
		l.emitAll(ev)
		return e
	}
	claim := l.load(l.sw(l.slot, sClaim)) + uint64(need)
	l.begin()
	l.store(l.sw(l.slot, sClaim), claim)
	l.add(l.hw(hClaimed), uint64(need))
	l.end()
	l.unlock()
	l.emitAll(ev)
	if err := a.g.SetCapacity(a.id, memapi.Bytes(claim)); err != nil {
		// Growing a live authority does not fail; if it did, the claim
		// goes back so the ledger never counts bytes nobody can use.
		_ = l.lock()
		l.begin()
		l.store(l.sw(l.slot, sClaim), claim-uint64(need))
		l.add(l.hw(hClaimed), -uint64(need))
		l.end()
		l.unlock()
		return err
	}
	a.clearWantLocked()
	return nil
}

// claimWaitersLocked claims for the local reservations that wait (a want
// they posted was answered, or capacity came free): the bytes they lack
// beyond the local free ones, all at once or, when the ledger cannot give
// them, posting the want again. A want this process posted is withdrawn
// once nobody waits.
func (a *Authority) claimWaitersLocked() {
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return
	}
	if snap.Waiters == 0 {
		if a.wanted {
			a.wanted = false
			a.clearWantLocked()
		}
		return
	}
	if snap.WaitingBytes > snap.Free {
		_ = a.claimLocked(PressureHolder, snap.WaitingBytes, snap.WaitingBytes-snap.Free, a.wantPri, true)
	}
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
	if a.released.Load() {
		return &LedgerError{Op: "xproc.Settle", Path: a.l.path, Err: ErrClosed}
	}
	a.answerLocked()
	a.claimWaitersLocked()
	return a.trimLocked(memapi.Bytes(maxBytes))
}

// ReturnAdmitted is the governor's hook for a reservation of n bytes that
// failed locally after Admit claimed for it (governor.AdmissionReturn): up
// to n bytes of the claim still spare go back to the ledger at once,
// rather than at the next settle (spare bytes beyond those stay the
// process's until then, as freed bytes do).
func (a *Authority) ReturnAdmitted(_ governor.HolderID, n memapi.Bytes) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.released.Load() {
		return
	}
	_ = a.trimLocked(n) // a ledger that cannot be locked now is trimmed by the next settle
}

// trimLocked gives back the spare claim, at most most bytes of it, and
// publishes the figures.
func (a *Authority) trimLocked(most memapi.Bytes) error {
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &LedgerError{Op: "xproc.Settle", Path: a.l.path, Err: ErrClosed, Detail: "the local authority was removed"}
	}
	spare := min(snap.Free, most)
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
	if a.released.Load() {
		return nil
	}
	if err := a.trimLocked(memapi.Bytes(maxBytes)); err != nil {
		a.released.Store(true)
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
	a.released.Store(true)
	return nil
}
