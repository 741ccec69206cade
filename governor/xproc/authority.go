package xproc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/privacct"
)

// pressureHolder is the holder an authority registers in its governor to
// answer other processes' pressure: its reservations, made with the asking
// process's priority, issue this process's tickets.
const pressureHolder governor.HolderID = "xproc.pressure"

// authority is a governor authority whose capacity is this process's claim
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
// comes through (governor.Governor.Reserve, and so pmm): Bind installs the
// authority as the local authority's governor.Admission.
type authority struct {
	l  *Ledger
	g  *governor.Governor
	id memapi.AuthorityID

	// sem orders this process's claims, capacity changes and settles:
	// between a claim and the local reservation it is for, nothing else
	// reserves or trims, so the claimed bytes are that reservation's. It
	// is a mutex whose waiters give up when their context ends, so a
	// reservation keeps its deadline while a settle answers a want.
	sem      chan struct{}
	released atomic.Bool // set once under sem; read without it by Reserve
	private  uint64      // bytes kept by KeepPrivate (under sem)

	// This process's want (its slot's), under sem.
	posted time.Time // when its current round was posted
	// The wants of others seen (under sem): the global want sequence at
	// the last scan, and per slot (-1: the operator's) the round last seen.
	seenSeq uint64
	seen    map[int]round

	// closeAccount ends the authority's account of the memory this
	// process's mechanisms keep for themselves (privacct), at release.
	closeAccount func()

	beforeClaim func(bytes memapi.Bytes) // tests only, set before use: runs in Admit before sem is taken
}

// round names one round of a want: the slot's owner and the round's
// sequence number.
type round struct {
	pid   int
	start uint64
	seq   uint64
}

// share is a part of another process's want this process took to answer.
type share struct {
	slot  int // -1: the operator's want
	owner round
	bytes memapi.Bytes
	pri   int
}

// Bind adds authority id to g with capacity 0, ties it to the ledger and
// starts the settler. A ledger binds one authority. The authority is the
// account of the memory this process's mechanisms keep for themselves on
// id (the CUDA mechanism's pool and spares, unless its Config.Private
// names another): what they keep already is claimed now, in this
// process's slot, and what they keep later as they start. When the
// ledger has no room for it Bind fails with the *governor.OverBudgetError
// and binds nothing.
//
// Every reservation on id then claims from the ledger, whatever API it
// comes through (governor.Governor.Reserve, and so pmm): a reservation that
// does not fit the local free bytes claims the shortfall first, and one
// the ledger cannot give fails with an *governor.OverBudgetError before any
// mechanism is called, or, when it may wait, posts a want that the other
// processes answer by asking their holders to free bytes.
func (l *Ledger) Bind(g *governor.Governor, id memapi.AuthorityID) error {
	_, err := l.bind(g, id)
	return err
}

// bind is Bind, and returns the authority it installed.
func (l *Ledger) bind(g *governor.Governor, id memapi.AuthorityID) (*authority, error) {
	l.binding.Lock()
	defer l.binding.Unlock()
	l.sem <- struct{}{}
	closed := l.closed
	<-l.sem
	if closed {
		return nil, &ledgerError{Op: "xproc.Bind", Path: l.path, Err: errClosed}
	}
	if old := l.auth.Load(); old != nil {
		return nil, ledgerErr("xproc.Bind", l.path, errInUse, "already bound to authority %s", old.id)
	}
	if err := g.AddAuthority(id, 0); err != nil {
		return nil, err
	}
	if err := g.Register(pressureHolder, nil, governor.HolderOptions{}); err != nil && !errors.Is(err, memapi.ErrInUse) {
		_ = g.RemoveAuthority(id)
		return nil, err
	}
	a := &authority{l: l, g: g, id: id, sem: make(chan struct{}, 1), seen: map[int]round{}}
	if err := g.SetAdmission(id, a); err != nil {
		_ = g.RemoveAuthority(id)
		return nil, err
	}
	// The private bytes are claimed with the file lock, so neither l.sem
	// nor a.sem is held here.
	closeAccount, err := privacct.Open(id, a)
	if err != nil {
		_ = g.RemoveAuthority(id)
		return nil, err
	}
	a.closeAccount = closeAccount
	l.sem <- struct{}{}
	defer func() { <-l.sem }()
	if l.closed { // closed meanwhile: the slot, and the private bytes in it, went with it
		closeAccount()
		_ = g.RemoveAuthority(id)
		return nil, &ledgerError{Op: "xproc.Bind", Path: l.path, Err: errClosed}
	}
	l.auth.Store(a)
	l.settled = make(chan struct{})
	go l.settle(a)
	return a, nil
}

// acquire takes a.sem before ctx ends and within the lock timeout, or
// returns a *lockError naming the file lock's holders (a call of this
// process holds a.sem, most often waiting for them).
func (a *authority) acquire(ctx context.Context, op string) error {
	select {
	case a.sem <- struct{}{}:
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, a.l.lockTimeout)
	defer cancel()
	start := time.Now()
	select {
	case a.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return lockTimeout(ctx, op, a.l.path, a.l.fd, start)
	}
}

func (a *authority) unacquire() { <-a.sem }

// Admit is the governor's admission hook on the bound authority
// (governor.Admission): it claims the shortfall from the ledger and raises
// the local capacity to the new claim, both under a.sem, so a settle never
// gives back a claim the capacity does not show yet. The shortfall is
// computed under a.sem (the waiting bytes and the reservation's beyond the
// local free ones), not taken from the governor's need, which a settle
// claiming for the waiters meanwhile would make stale: the claims are never
// more than what the reservations ahead and this one lack. The governor calls it
// without its own lock when a reservation does not fit; pressureHolder's
// reservations (answers to another process's want) never claim. Its waits
// for a.sem and for the file lock end with ctx: the reservation then fails
// with an *governor.OverBudgetError whose Err is the *lockError (or the
// context's cause) and whose Capacity is 0 (the ledger was not read).
func (a *authority) Admit(ctx context.Context, holder governor.HolderID, bytes, _ memapi.Bytes, priority int, wait bool) error {
	if holder == pressureHolder {
		return errOwnHolder
	}
	if a.beforeClaim != nil {
		a.beforeClaim(bytes)
	}
	if err := a.acquire(ctx, "xproc.Reserve"); err != nil {
		return a.gaveUp(holder, bytes, err, "another call of this process held the shared authority")
	}
	defer a.unacquire()
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &ledgerError{Op: "xproc.Reserve", Path: a.l.path, Err: errClosed, Detail: "the local authority was removed"}
	}
	if snap.WaitingBytes+bytes <= snap.Free {
		return nil // nothing is short any more: the governor tries again
	}
	if err := ctx.Err(); err != nil {
		return a.gaveUp(holder, bytes, context.Cause(ctx), "the reservation's context ended")
	}
	return a.claimLocked(ctx, holder, bytes, snap.WaitingBytes+bytes-snap.Free, priority, wait)
}

// gaveUp is the failure of a reservation whose context ended while it
// waited for a lock: Capacity 0 (the ledger was not read), so the governor
// ends it with this error rather than queueing it.
func (a *authority) gaveUp(holder governor.HolderID, bytes memapi.Bytes, cause error, why string) error {
	return &governor.OverBudgetError{Op: "xproc.Reserve", Kind: memapi.ErrOverBudget, Authority: a.id, Holder: holder,
		Reason: fmt.Sprintf("gave up at the reservation's deadline: %s (%v)", why, cause), Wanted: bytes, Err: cause}
}

// claimLocked claims need more bytes from the ledger for a reservation of
// bytes and raises the local capacity to the claim; a reservation that will
// wait posts this process's want when the ledger cannot give it. Called
// with a.sem held.
func (a *authority) claimLocked(ctx context.Context, holder governor.HolderID, bytes, need memapi.Bytes, priority int, wait bool) error {
	if a.released.Load() {
		return &ledgerError{Op: "xproc.Reserve", Path: a.l.path, Err: errClosed}
	}
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &ledgerError{Op: "xproc.Reserve", Path: a.l.path, Err: errClosed, Detail: "the local authority was removed"}
	}
	l := a.l
	if uint64(need) > maxBytes {
		return &governor.OverBudgetError{Op: "xproc.Reserve", Kind: memapi.ErrOverBudget, Authority: a.id, Holder: holder,
			Reason: "beyond any shared capacity", Wanted: bytes, Free: snap.Free}
	}
	// A stale slot must not refuse a live process: when the ledger looks
	// short, the gone members are found first, outside the lock, and
	// reclaimed under it.
	var gone []slotOwner
	if uint64(need) > l.freeHint() {
		gone = l.goneMembers()
	}
	if err := l.lock(ctx, "xproc.Reserve"); err != nil {
		if errors.Is(err, errLockTimeout) {
			return a.gaveUp(holder, bytes, err, "the shared ledger's lock was held")
		}
		return err
	}
	ev := l.reclaimGoneLocked(gone)
	free := l.freeLocked()
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
			a.postLocked(uint64(need)-free, priority)
		}
		l.unlock()
		l.emitAll(ev)
		return e
	}
	claim := l.load(l.sw(l.slot, sClaim)) + uint64(need)
	l.store(l.sw(l.slot, sClaim), claim)
	l.add(l.hw(hClaimed), uint64(need))
	l.unlock()
	l.emitAll(ev)
	if err := a.g.SetCapacity(a.id, memapi.Bytes(claim-a.private)); err != nil {
		// Growing a live authority does not fail; if it did, the claim
		// goes back so the ledger never counts bytes nobody can use.
		if l.lock(context.Background(), "xproc.Reserve") == nil {
			l.store(l.sw(l.slot, sClaim), l.load(l.sw(l.slot, sClaim))-uint64(need))
			l.add(l.hw(hClaimed), -uint64(need))
			l.unlock()
		}
		return err
	}
	return nil
}

// postLocked posts (or updates) this process's want of short bytes with
// priority, under a.sem and the file lock. A new want, or one whose last
// round has been answered (nothing out) and which is still short, starts a
// round: all of it left for the other processes to split. A want that
// grew adds the growth to what is left; one that shrank keeps its round.
// A round whose answers never came back (an answering process died) starts
// again after ten Polls.
func (a *authority) postLocked(short uint64, priority int) {
	l := a.l
	want, left, out := l.load(l.sw(l.slot, sWant)), l.load(l.sw(l.slot, sWantLeft)), l.load(l.sw(l.slot, sWantOut))
	since := time.Since(a.posted)
	switch {
	case want == 0 || out == 0 && (left == 0 || since >= l.poll) || since >= 10*l.poll:
		left, out = short, 0
	case short > want:
		left += short - want
	case short < want:
		left = min(left, short)
		out = min(out, short-left)
		l.store(l.sw(l.slot, sWant), short)
		l.store(l.sw(l.slot, sWantLeft), left)
		l.store(l.sw(l.slot, sWantOut), out)
		return
	default:
		return // its round is being answered
	}
	// The figures that bound the others first: want before left and out
	// when it grows.
	l.store(l.sw(l.slot, sWant), short)
	l.store(l.sw(l.slot, sWantLeft), left)
	l.store(l.sw(l.slot, sWantOut), out)
	l.store(l.sw(l.slot, sWantPri), uint64(int64(priority)))
	l.add(l.sw(l.slot, sWantSeq), 1)
	l.add(l.hw(hWantSeq), 1)
	a.posted = time.Now()
}

// withdrawLocked withdraws this process's want, under a.sem and the file
// lock: its reservations are served or gave up.
func (a *authority) withdrawLocked() {
	l := a.l
	for _, w := range []int{sWantLeft, sWantOut, sWant} {
		l.store(l.sw(l.slot, w), 0)
	}
}

// claimWaitersLocked claims for the local reservations that wait (a want
// they posted was answered, or capacity came free): the bytes they lack
// beyond the local free ones, all at once or, when the ledger cannot give
// them, posting the want again. The want is withdrawn once nobody waits.
func (a *authority) claimWaitersLocked(ctx context.Context) error {
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return nil
	}
	l := a.l
	if snap.Waiters == 0 || snap.WaitingBytes <= snap.Free {
		if l.load(l.sw(l.slot, sWant)) == 0 {
			return nil
		}
		if err := l.lock(ctx, "xproc.Settle"); err != nil {
			return err
		}
		a.withdrawLocked()
		l.unlock()
		return nil
	}
	err := a.claimLocked(ctx, pressureHolder, snap.WaitingBytes, snap.WaitingBytes-snap.Free, a.wantPri(), true)
	var ob *governor.OverBudgetError
	if errors.As(err, &ob) {
		return nil // posted: the others answer it
	}
	return err
}

// wantPri is the priority of this process's want (0 when none).
func (a *authority) wantPri() int {
	return int(int64(a.l.load(a.l.sw(a.l.slot, sWantPri))))
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

// settle publishes the local figures into this process's slot and gives
// the claimed bytes it does not use back to the ledger; it also answers its
// share of other processes' wants and claims for the local waiters. The
// settler calls it every Poll. It fails with errClosed after Close, and
// with the ledger's error (a *lockError when ctx ended first) when the file
// cannot be locked (then nothing was given back). While the holders are
// asked (at most one Poll) this process's reservations wait for a.sem, each
// at most until its context ends.
func (a *authority) settle(ctx context.Context) error {
	if err := a.acquire(ctx, "xproc.Settle"); err != nil {
		return err
	}
	defer a.unacquire()
	if a.released.Load() {
		return &ledgerError{Op: "xproc.Settle", Path: a.l.path, Err: errClosed}
	}
	shares, err := a.takeShares(ctx)
	if err != nil {
		return err
	}
	a.answer(shares)
	if err := a.claimWaitersLocked(ctx); err != nil {
		a.trimLocked(ctx, memapi.Bytes(maxBytes), shares)
		return err
	}
	return a.trimLocked(ctx, memapi.Bytes(maxBytes), shares)
}

// ReturnAdmitted is the governor's hook for a reservation of n bytes that
// failed locally after Admit claimed for it (the governor calls it on an
// Admission that has it): up
// to n bytes of the claim still spare go back to the ledger at once,
// rather than at the next settle (spare bytes beyond those stay the
// process's until then, as freed bytes do). It waits for the locks at most
// one Poll: the next settle trims what it could not.
func (a *authority) ReturnAdmitted(_ governor.HolderID, n memapi.Bytes) {
	ctx, cancel := context.WithTimeout(a.l.ctx, a.l.poll)
	defer cancel()
	if a.acquire(ctx, "xproc.ReturnAdmitted") != nil {
		return
	}
	defer a.unacquire()
	if a.released.Load() {
		return
	}
	_ = a.trimLocked(ctx, n, nil) // a ledger that cannot be locked now is trimmed by the next settle
}

// trimLocked gives back the spare claim, at most most bytes of it,
// publishes the figures, and marks the shares answered (what they freed is
// back in the ledger now).
func (a *authority) trimLocked(ctx context.Context, most memapi.Bytes, shares []share) error {
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return &ledgerError{Op: "xproc.Settle", Path: a.l.path, Err: errClosed, Detail: "the local authority was removed"}
	}
	spare := min(snap.Free, most)
	if snap.Waiters != 0 {
		spare = 0 // the local waiters are owed these bytes
	}
	if spare != 0 && a.g.SetCapacity(a.id, snap.Capacity-spare) != nil {
		spare = 0
	}
	l := a.l
	if err := l.lock(ctx, "xproc.Settle"); err != nil {
		if spare != 0 {
			// Keep the local capacity equal to the claim.
			_ = a.g.SetCapacity(a.id, snap.Capacity)
		}
		return err
	}
	defer l.unlock()
	figs := []struct {
		slot, total int
		v           uint64
	}{{sReserved, hReserved, uint64(snap.Reserved)}, {sCharged, hCharged, uint64(snap.Charged)}, {sPending, hPending, uint64(snap.Pending)}}
	// The slot uses no more than it claims after every single store, so
	// a process that dies here leaves a slot parse accepts once the next
	// holder repairs the totals: the figures that fall first, then those
	// that rise (every mix is at most the old or the new use, both within
	// the old claim), then the claim shrinks to the new use.
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
	l.store(l.sw(l.slot, sClaim), uint64(snap.Capacity-spare)+a.private)
	l.add(l.hw(hClaimed), -uint64(spare))
	l.add(l.sw(l.slot, sSeq), 1)
	for _, s := range shares {
		out := l.hw(hWantOut)
		if s.slot >= 0 {
			if int(l.load(l.sw(s.slot, sPID))) != s.owner.pid || l.load(l.sw(s.slot, sStart)) != s.owner.start {
				continue // its owner died: the want went with the slot
			}
			out = l.sw(s.slot, sWantOut)
		}
		l.store(out, l.load(out)-min(l.load(out), uint64(s.bytes)))
	}
	return nil
}

// takeShares takes this process's shares of the wants posted since the
// last scan, under the file lock: of each new round, at most what is left
// of it and what this process can free (its spare claim and the bytes its
// holders can reclaim, nothing while its own reservations wait), moved
// from left to out. So the processes answering one want ask their holders
// for the want in total, not each for all of it. A process with nothing to
// give takes nothing: the next round (the asking process posts it again
// when still short) asks again.
func (a *authority) takeShares(ctx context.Context) ([]share, error) {
	l := a.l
	seq := l.load(l.hw(hWantSeq))
	if seq == a.seenSeq {
		return nil, nil
	}
	snap, ok := a.g.Authority(a.id)
	if !ok {
		return nil, nil
	}
	// Only a living process's want is answered: which wanting processes
	// live is read outside the lock, and a gone one's slot, want and all,
	// is reclaimed in this pass rather than answered.
	var live, gone []slotOwner
	for i := 0; i < l.slots; i++ {
		pid := int(l.load(l.sw(i, sPID)))
		if i == l.slot || pid == 0 || l.load(l.sw(i, sWant)) == 0 {
			continue
		}
		m := slotOwner{slot: i, pid: pid, start: l.load(l.sw(i, sStart))}
		if alive(m.pid, m.start) {
			live = append(live, m)
		} else {
			gone = append(gone, m)
		}
	}
	if err := l.lock(ctx, "xproc.Settle"); err != nil {
		return nil, err
	}
	ev := l.reclaimGoneLocked(gone)
	defer func() {
		l.unlock()
		l.emitAll(ev)
	}()
	a.seenSeq = seq // a want posted since seq was read is taken by the next settle
	can := min(snap.Free+snap.Reclaimable, snap.Capacity)
	if snap.Waiters != 0 {
		can = 0
	}
	var shares []share
	take := func(slot int, owner round, left, out *uint64, pri int) {
		if a.seen[slot] == owner {
			return
		}
		a.seen[slot] = owner
		n := min(memapi.Bytes(l.load(left)), can)
		if n == 0 {
			return
		}
		can -= n
		l.store(left, l.load(left)-uint64(n))
		l.add(out, uint64(n))
		shares = append(shares, share{slot: slot, owner: owner, bytes: n, pri: pri})
	}
	if l.load(l.hw(hWant)) != 0 {
		take(-1, round{seq: l.load(l.hw(hOpSeq))}, l.hw(hWantLeft), l.hw(hWantOut), 0)
	}
	for _, m := range live {
		// A want posted since the read above waits for the next settle,
		// as does one whose slot changed owner meanwhile.
		if !l.holdsLocked(m) || l.load(l.sw(m.slot, sWant)) == 0 {
			continue
		}
		take(m.slot, round{pid: m.pid, start: m.start, seq: l.load(l.sw(m.slot, sWantSeq))},
			l.sw(m.slot, sWantLeft), l.sw(m.slot, sWantOut), int(int64(l.load(l.sw(m.slot, sWantPri)))))
	}
	return shares, nil
}

// answer turns each share into pressure on this process's holders: a
// reservation by pressureHolder of the share's bytes, with the asking
// process's priority, for one Poll. The governor then issues tickets
// exactly as for a local shortfall (lower holder priority first,
// guarantees never asked), and the bytes the holders free are trimmed back
// to the ledger, where the asking process claims them.
func (a *authority) answer(shares []share) {
	for _, s := range shares {
		if s.slot >= 0 && !alive(s.owner.pid, s.owner.start) {
			continue // it died since its share was taken: nothing is freed for it (its slot goes next round)
		}
		ctx, cancel := context.WithTimeout(a.l.ctx, a.l.poll)
		if gr, err := a.g.Reserve(ctx, governor.Request{Authority: a.id, Holder: pressureHolder, Role: "xproc.pressure", Bytes: s.bytes, Priority: s.pri}); err == nil {
			_ = gr.Cancel()
		}
		cancel()
	}
}

// KeepPrivate claims bytes of the shared capacity for device memory this
// process's mechanisms keep for themselves, outside any reservation (the
// CUDA mechanism's handle pool and spare chunks: cuda.Config.Private): the
// slot's claim covers them, so the claims of all processes never exceed
// what the device can hold, pools included. It fails with an
// *governor.OverBudgetError when the ledger has no room for them: the
// mechanism then refuses to start. They are not in the local capacity.
func (a *authority) KeepPrivate(bytes memapi.Bytes) error {
	ctx, cancel := context.WithTimeout(a.l.ctx, a.l.lockTimeout)
	defer cancel()
	if err := a.acquire(ctx, "xproc.KeepPrivate"); err != nil {
		return err
	}
	defer a.unacquire()
	if a.released.Load() {
		return &ledgerError{Op: "xproc.KeepPrivate", Path: a.l.path, Err: errClosed}
	}
	if uint64(bytes) > maxBytes {
		return memapi.Errorf("xproc.KeepPrivate", memapi.ErrInvalidSize, "%d bytes", bytes)
	}
	l := a.l
	var gone []slotOwner
	if uint64(bytes) > l.freeHint() {
		gone = l.goneMembers() // outside the lock, as for a claim
	}
	if err := l.lock(ctx, "xproc.KeepPrivate"); err != nil {
		return err
	}
	ev := l.reclaimGoneLocked(gone)
	free := l.freeLocked()
	if uint64(bytes) > free {
		e := &governor.OverBudgetError{Op: "xproc.KeepPrivate", Kind: memapi.ErrOverBudget, Authority: a.id,
			Reason: fmt.Sprintf("the shared ledger %s has %d bytes unclaimed: no room for %d bytes a mechanism keeps for itself", l.path, free, bytes),
			Wanted: bytes, Free: memapi.Bytes(free), Capacity: memapi.Bytes(l.load(l.hw(hCapacity)))}
		l.unlock()
		l.emitAll(ev)
		return e
	}
	l.add(l.sw(l.slot, sClaim), uint64(bytes))
	l.add(l.sw(l.slot, sPrivate), uint64(bytes))
	l.add(l.hw(hClaimed), uint64(bytes))
	l.add(l.hw(hPrivate), uint64(bytes))
	a.private += uint64(bytes)
	l.unlock()
	l.emitAll(ev)
	return nil
}

// ReleasePrivate gives back bytes kept by KeepPrivate, once the mechanism
// released the memory (cuda's Close). More than is kept is
// memapi.ErrInvalidSize, and changes nothing.
func (a *authority) ReleasePrivate(bytes memapi.Bytes) error {
	ctx, cancel := context.WithTimeout(context.Background(), a.l.lockTimeout)
	defer cancel()
	if err := a.acquire(ctx, "xproc.ReleasePrivate"); err != nil {
		return err
	}
	defer a.unacquire()
	if uint64(bytes) > a.private {
		return memapi.Errorf("xproc.ReleasePrivate", memapi.ErrInvalidSize, "%d bytes, %d kept", bytes, a.private)
	}
	l := a.l
	if err := l.lock(ctx, "xproc.ReleasePrivate"); err != nil {
		return err
	}
	l.add(l.sw(l.slot, sPrivate), -uint64(bytes))
	l.add(l.sw(l.slot, sClaim), -uint64(bytes))
	l.add(l.hw(hPrivate), -uint64(bytes))
	l.add(l.hw(hClaimed), -uint64(bytes))
	a.private -= uint64(bytes)
	l.unlock()
	return nil
}

// release empties the claim and removes the local authority, for Close. It
// fails with errInUse while the authority holds bytes (private ones
// included), and with a *lockError when the lock is not taken before ctx
// ends; both change nothing.
func (a *authority) release(ctx context.Context) error {
	if err := a.acquire(ctx, "xproc.Close"); err != nil {
		return err
	}
	defer a.unacquire()
	if a.released.Load() {
		return nil
	}
	if a.private != 0 {
		return ledgerErr("xproc.Close", a.l.path, errInUse, "authority %s keeps %d private bytes (a mechanism not closed)", a.id, a.private)
	}
	if err := a.trimLocked(ctx, memapi.Bytes(maxBytes), nil); err != nil {
		if errors.Is(err, errLockTimeout) {
			return err
		}
		a.released.Store(true)
		a.closeAccount()
		return err
	}
	snap, ok := a.g.Authority(a.id)
	if ok && (snap.Capacity != 0 || snap.Grants != 0) {
		return ledgerErr("xproc.Close", a.l.path, errInUse, "authority %s holds %d reserved, %d charged, %d pending", a.id, snap.Reserved, snap.Charged, snap.Pending)
	}
	if ok {
		if err := a.g.RemoveAuthority(a.id); err != nil {
			return err
		}
	}
	a.released.Store(true)
	a.closeAccount()
	return nil
}
