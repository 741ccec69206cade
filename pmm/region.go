package pmm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// segment is one backed piece of a region, in address order: private
// committed memory (with its lease), a view of a Shared backing, or the
// private view a copy-on-write made (with the lease of its new backing).
type segment struct {
	r      memapi.Range
	lease  governor.Lease // commit and copy-on-write segments
	view   *memapi.View   // view segments
	shared *sharedState   // view of a shared backing; nil for a copy-on-write view
	// grant, instead of lease: backing whose rollback failed before its
	// grant could be committed; removing it refunds (undraws) the grant,
	// which is then cancelled.
	grant governor.Grant
	quar  bool // its free failed: its bytes are booked quarantined
	hole  bool // nothing installed (a copy-on-write undo could not map back)
	// unmapped: the view is gone but its private backing's release
	// failed; a retry releases only the backing.
	unmapped bool
	backing  *memapi.Backing
}

// committed reports whether the segment is private committed memory, which
// adjacent ones are decommitted in one call.
func (s segment) committed() bool { return s.view == nil && !s.hole && !s.unmapped }

// joins reports whether the segment is decommitted in one call with the
// adjacent ones that join too: private committed memory, not quarantined.
// Quarantined pieces go one by one: a retry, where each may find its
// memory already freed (remove).
func (s segment) joins() bool { return s.committed() && !s.quar }

// account is what removing the segment refunds.
func (s segment) account() memapi.Account {
	switch {
	case s.grant != (governor.Grant{}):
		return s.grant
	case s.quar:
		return s.lease.QuarantinedAccount()
	}
	return s.lease
}

// Region is a growable range of device addresses (VirtualBacking): the
// address never moves while backing is installed and removed behind it. It
// is backed from its start up to Len, by private commits and by views of
// shared backings, except for holes: granule-aligned ranges below Len with
// no backing, which Decommit makes and Commit backs (holes.go). Commit
// also backs any range above Len (a sparse commit), which raises Len to
// its end.
//
// Its lifecycle is ep.Lifecycle's. Every transaction (Grow, Shrink,
// MapShared, CopyOnWrite, Decommit, Commit) holds the region open: Close during one returns at
// once and the release is scheduled when the transaction ends, so the
// release sees the state it left; a transaction that had not begun fails
// with memapi.ErrClosed. Backing whose removal failed (a rollback, a
// shrink's release, the final release) is quarantined: its bytes stay
// charged and visible, and a later transaction that backs its range
// (Grow, Commit, MapShared), Retry or Close removes it first.
type Region struct {
	ep.Owned
	s *regionState
}

// regionState is everything the region's release needs; it never refers
// to the Region, so the leak backstop can run.
type regionState struct {
	lc   *ep.Lifecycle
	bind *Binding
	d    *device
	mech memapi.Mechanism
	vb   memapi.VirtualBacking
	res  *memapi.Reservation
	gran memapi.Bytes

	txn chan struct{} // serializes transactions; taken with the caller's ctx

	mu      sync.Mutex
	segs    []segment // in address order; gaps below top are holes
	top     memapi.Bytes
	quar    []segment        // removal failed (above top, or in a hole), retried first
	shrinks []*ep.Completion // shrink and decommit releases not run yet
	resGone bool             // the reservation was released
}

// ReserveVirtual reserves max bytes of addresses for a growable region. When
// the device's mechanism lacks VirtualBacking it returns an error for which
// errors.Is(err, errors.ErrUnsupported) holds: the caller then chooses its
// explicit fallback (e.g. Allocate the maximum eagerly).
func (b *Binding) ReserveVirtual(ctx context.Context, max memapi.Bytes) (*Region, error) {
	var site *ep.Site
	if b.m.opts.RecordSites {
		site = new(ep.Site)
		runtime.Callers(2, site[:])
	}
	d, err := b.begin("pmm.ReserveVirtual")
	if err != nil {
		return nil, err
	}
	h, err := b.reserveVirtual(ctx, d, max, site)
	if err != nil {
		b.release()
	}
	return h, err
}

func (b *Binding) reserveVirtual(ctx context.Context, d *device, max memapi.Bytes, site *ep.Site) (*Region, error) {
	vb, err := memapi.RequireVirtualBacking(d.mech)
	if err != nil {
		return nil, err
	}
	res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: max})
	if err != nil {
		return nil, err
	}
	s := &regionState{bind: b, d: d, mech: d.mech, vb: vb, res: res, gran: d.info.Granularity,
		txn: make(chan struct{}, 1)}
	r := &Region{s: s}
	if err := d.ctx.OwnIn(&r.Owned, b.holder+"/"+b.role+" region", s, ep.Origin{Bytes: res.Size(), Addr: uint64(res.Addr()), Site: site}); err != nil {
		return nil, errors.Join(err, vb.ReleaseReservation(ctx, res, b.m.g.Split(d.authority, nil)))
	}
	s.lc = r.Lifecycle()
	return r, nil
}

// Addr returns the region's stable base address.
func (r *Region) Addr() memapi.DeviceAddr { return r.s.res.Addr() }

// Cap returns the bytes of address space reserved.
func (r *Region) Cap() memapi.Bytes { return r.s.res.Size() }

// Len returns the bytes backed from the start of the region.
func (r *Region) Len() memapi.Bytes { return r.s.len() }

// Quarantined returns the bytes of backing whose removal failed and that
// wait for a retry (a transaction that backs their range, Retry or Close),
// still charged.
func (r *Region) Quarantined() memapi.Bytes {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	var n memapi.Bytes
	for _, q := range r.s.quar {
		n += q.r.Len
	}
	return n
}

func (s *regionState) len() memapi.Bytes {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.top
}

// Granularity returns the unit in which the region grows.
func (r *Region) Granularity() memapi.Bytes { return r.s.gran }

// Close schedules the region's release behind its recorded fences, or,
// while a transaction (Grow, Shrink, Commit...) holds it, when that ends;
// it returns without waiting for the device. The backing is freed once
// the fences completed, then refunded, and the addresses released. On a
// quarantined region it retries the release; otherwise a second Close
// returns nil.
func (r *Region) Close() error { return r.Owned.Close() }

// RecordUse records a fence of device work that uses the region: nothing
// of it is decommitted (by Close, Shrink or Decommit) before the fence
// completes. It fails with memapi.ErrReleased once the release is
// scheduled.
func (r *Region) RecordUse(f memapi.Fence) error { return r.Owned.RecordUse(f) }

// State returns where the region is in its lifecycle (ep.Lifecycle).
func (r *Region) State() ep.State { return r.Owned.State() }

// Err returns the error of the region's last failed release (of kind
// ep.ErrQuarantined) while it is quarantined, else nil.
func (r *Region) Err() error { return r.Owned.Err() }

// Retry removes quarantined backing now (its fences completed before it was
// quarantined) and, once the region is closed, queues its failed release
// again. It returns what still failed.
func (r *Region) Retry(ctx context.Context) error {
	if r.State() == ep.Quarantined {
		return r.Owned.Retry()
	}
	const op = "pmm.Region.Retry"
	if err := r.s.begin(ctx, op); err != nil {
		return err
	}
	defer r.s.end()
	return r.s.settleQuarantine(ctx, op, r.s.whole())
}

// begin starts a transaction: it holds the region open, takes its turn, and
// waits (bounded by ctx) for earlier shrinks' releases to run, since the
// range they freed is not reusable until it is really gone.
func (s *regionState) begin(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "context ended before the transaction began", Err: err}
	}
	if err := s.lc.Begin(op); err != nil {
		return err
	}
	select {
	case s.txn <- struct{}{}:
		// Begin held the region open and no transaction ran between:
		// this one comes before any Close.
	default:
		select {
		case s.txn <- struct{}{}:
		case <-ctx.Done():
			_ = s.lc.End()
			return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "region busy", Err: ctx.Err()}
		}
		// Another transaction ran meanwhile: the region may have been
		// closed during it.
		if st := s.lc.State(); st != ep.Open {
			s.end()
			return memapi.Errorf(op, memapi.ErrClosed, "region is %v", st)
		}
	}
	s.mu.Lock()
	shrinks := slices.Clone(s.shrinks)
	s.mu.Unlock()
	for _, c := range shrinks {
		if err := c.Wait(ctx); err != nil {
			s.end()
			return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "earlier shrink still waits for fences", Err: err}
		}
	}
	s.mu.Lock()
	s.shrinks = slices.DeleteFunc(s.shrinks, (*ep.Completion).Done)
	s.mu.Unlock()
	return nil
}

// end ends a transaction; fences order the region's final release behind
// work the transaction queued.
func (s *regionState) end(fences ...memapi.Fence) {
	<-s.txn
	_ = s.lc.End(fences...) // a scheduling failure quarantines the region
}

// settleQuarantine removes the quarantined backing that overlaps rng, the
// range the transaction is about to back, before it is used again; pieces
// elsewhere stay quarantined (charged, visible) for the transaction that
// needs their range, Retry or the final release, so one piece that cannot
// be removed blocks only the transactions that need its range. Called in a
// transaction.
func (s *regionState) settleQuarantine(ctx context.Context, op string, rng memapi.Range) error {
	s.mu.Lock()
	var q, keep []segment
	for _, sg := range s.quar {
		if sg.r.Overlaps(rng) {
			q = append(q, sg)
		} else {
			keep = append(keep, sg)
		}
	}
	s.quar = keep
	s.mu.Unlock()
	if len(q) == 0 {
		return nil
	}
	left, err := s.removeAll(ctx, q)
	s.quarantine(left) // back, in address order; what is booked stays booked
	if err != nil {
		return &memapi.Error{Op: op, Kind: ep.ErrQuarantined, Authority: s.d.authority, Wanted: sumLen(left),
			Detail: fmt.Sprintf("quarantined backing in %v could not be removed; Retry", rng), Err: err}
	}
	return nil
}

// grantName names the grant of rng for the context's list of leftovers.
func (s *regionState) grantName(rng memapi.Range) string {
	return fmt.Sprintf("%s/%s region grant [%#x, +%#x)", s.bind.holder, s.bind.role, rng.Off, rng.Len)
}

// back is the first half of a transaction that backs rng (Grow, Commit):
// the quarantined backing over rng is removed, a grant for rng's bytes is
// reserved (with pressure, bounded by ctx) and the mechanism commits rng,
// drawing from it. On a failure nothing is left: the grant is cancelled.
// The caller commits the grant into the new piece's lease, or rolls back.
func (s *regionState) back(ctx context.Context, op string, rng memapi.Range) (governor.Grant, error) {
	s.mu.Lock()
	quarantined := len(s.quar) != 0
	s.mu.Unlock()
	if quarantined {
		if err := s.settleQuarantine(ctx, op, rng); err != nil {
			return governor.Grant{}, err
		}
	}
	r := s.bind.req
	r.Authority, r.Bytes = s.d.authority, rng.Len
	g, err := s.bind.m.g.Reserve(ctx, r)
	if err != nil {
		return governor.Grant{}, err
	}
	if err := s.vb.Commit(ctx, s.res, rng, g); err != nil {
		return governor.Grant{}, cancel(s.d, s.grantName(rng), g, err)
	}
	return g, nil
}

// whole is the region's whole reserved range: what Retry settles.
func (s *regionState) whole() memapi.Range { return memapi.Range{Len: s.res.Size()} }

func sumLen(segs []segment) memapi.Bytes {
	var n memapi.Bytes
	for _, s := range segs {
		n += s.r.Len
	}
	return n
}

// guard runs f; should it panic, undo runs first and the panic goes on.
// Holder callbacks are guarded so: the region and the ledger are rolled
// back, the holder's own view is the holder's to repair.
func guard(f func() error, undo func()) error {
	ok := false
	defer func() {
		if !ok {
			undo()
		}
	}()
	err := f()
	ok = true
	return err
}

// Grow backs the region up to newLen bytes (rounded up to the granularity)
// as one transaction: grant → commit the new range → update(newLen), the
// holder's view → commit the charge. On any failure the range is decommitted,
// the grant returned, update is called again with the old length if it had
// run, and the region is as before; should the decommit itself fail, the
// range is quarantined (charged, visible) and the error is of kind
// ep.ErrQuarantined. A panicking update rolls back the same way, then
// panics on. Growing to at most Len only calls update.
func (r *Region) Grow(ctx context.Context, newLen memapi.Bytes, update func(newLen memapi.Bytes) error) error {
	const op = "pmm.Region.Grow"
	s := r.s
	if err := s.begin(ctx, op); err != nil {
		return err
	}
	defer s.end()
	s.mu.Lock()
	old := s.top
	s.mu.Unlock()
	newTop, ok := memapi.RoundUp(newLen, s.gran)
	if !ok || newTop > s.res.Size() {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: newLen, Available: s.res.Size(), Detail: "beyond the reserved range"}
	}
	if newTop <= old {
		if update != nil {
			return update(newLen)
		}
		return nil
	}
	rng := memapi.Range{Off: old, Len: newTop - old}
	g, err := s.back(ctx, op, rng)
	if err != nil {
		return err
	}
	rollback := func(err error, viewUpdated bool) error {
		if viewUpdated {
			err = errors.Join(err, update(old))
		}
		if derr := s.vb.Decommit(ctx, s.res, rng, g); derr != nil {
			return s.quarantineGrow(rng, g, errors.Join(err, derr))
		}
		return cancel(s.d, s.grantName(rng), g, err)
	}
	if update != nil {
		if err := guard(func() error { return update(newLen) }, func() { _ = rollback(nil, false) }); err != nil {
			return rollback(err, false)
		}
	}
	lease, err := g.Commit()
	if err != nil {
		return rollback(err, update != nil)
	}
	s.mu.Lock()
	s.segs = append(s.segs, segment{r: rng, lease: lease})
	s.top = newTop
	s.mu.Unlock()
	return nil
}

// quarantineGrow keeps a grown range whose rollback could not decommit it:
// committed into a quarantined lease when the grant still commits, else kept
// with its open grant (the drawn bytes stay reserved). Either way the bytes
// stay visible and the next transaction that backs the range (Grow, Commit,
// MapShared), Retry or Close removes it first.
func (s *regionState) quarantineGrow(rng memapi.Range, g governor.Grant, err error) error {
	return s.quarantineCommit("pmm.Region.Grow", rng, g, err)
}

// quarantineCommit is quarantineGrow for the operation op (Grow, Commit).
func (s *regionState) quarantineCommit(op string, rng memapi.Range, g governor.Grant, err error) error {
	seg := segment{r: rng, grant: g, quar: true}
	if lease, cerr := g.Commit(); cerr == nil {
		seg.grant, seg.lease = governor.Grant{}, lease
		if qerr := lease.Quarantine(rng.Len); qerr != nil {
			err = errors.Join(err, qerr)
		}
	}
	s.mu.Lock()
	s.quar = append(s.quar, seg)
	s.mu.Unlock()
	return &memapi.Error{Op: op, Kind: ep.ErrQuarantined, Authority: s.d.authority, Wanted: rng.Len,
		Detail: "rollback could not remove the new backing; it stays charged until a retry removes it", Err: err}
}

// Shrink removes backing above newLen (rounded up to the granularity; a
// view is removed whole, so newLen rounds up to the end of a view it cuts).
// update(newLen) runs first, so the holder stops using the range; the removed
// backing is released behind the region's recorded fences, its lease pending
// until then, and the range is reused only after that release ran. A failing
// (or panicking) update changes nothing. A release that fails quarantines
// the backing.
func (r *Region) Shrink(ctx context.Context, newLen memapi.Bytes, update func(newLen memapi.Bytes) error) error {
	const op = "pmm.Region.Shrink"
	s := r.s
	if err := s.begin(ctx, op); err != nil {
		return err
	}
	var done memapi.Fence
	defer func() { s.end(done) }()
	newTop, ok := memapi.RoundUp(newLen, s.gran)
	if !ok {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: newLen}
	}
	s.mu.Lock()
	if newTop >= s.top {
		s.mu.Unlock()
		if update != nil {
			return update(newLen)
		}
		return nil
	}
	// Find the cut: whole views stay whole.
	keep := len(s.segs)
	for keep > 0 && s.segs[keep-1].r.Off >= newTop {
		keep--
	}
	partial := -1
	if keep > 0 {
		sg := s.segs[keep-1]
		if end := sg.r.Off + sg.r.Len; end > newTop {
			if !sg.committed() {
				newTop = end
			} else {
				partial = keep - 1
			}
		}
	}
	s.mu.Unlock()
	if update != nil {
		if err := update(newLen); err != nil {
			return err
		}
	}
	s.mu.Lock()
	var drop []segment
	if partial >= 0 {
		p := &s.segs[partial]
		cut := p.r.Off + p.r.Len - newTop
		drop = append(drop, segment{r: memapi.Range{Off: newTop, Len: cut}, lease: p.lease})
		p.r.Len -= cut
	}
	drop = append(drop, s.segs[keep:]...)
	clear(s.segs[keep:])
	s.segs = s.segs[:keep]
	s.top = newTop
	var dropped memapi.Bytes
	for _, sg := range drop {
		dropped += sg.r.Len
		if sg.lease != (governor.Lease{}) {
			_ = sg.lease.MarkPending(sg.r.Len)
		}
	}
	s.mu.Unlock()
	var err error
	done, err = s.queueRelease(op, fmt.Sprintf("shrink of region %#x to %d", s.res.Addr(), newTop), dropped, drop)
	return err
}

// queueRelease queues the release of drop, segments the caller's
// transaction (Shrink, Decommit) took out of the region's ledger and marked
// pending, behind the region's recorded fences, and returns the completion
// later transactions wait for (begin). A release the queue cannot schedule
// (a closing queue, which a live region's pin forbids) leaves nothing to
// wait for: drop is quarantined (charged, visible, retried like a release
// that failed) and the error is of kind ep.ErrQuarantined.
func (s *regionState) queueRelease(op, name string, wanted memapi.Bytes, drop []segment) (memapi.Fence, error) {
	c := ep.NewCompletion()
	s.mu.Lock()
	s.shrinks = append(s.shrinks, c)
	s.mu.Unlock()
	err := s.d.ctx.Queue().Enqueue(ep.Release{
		Name:   name,
		Fences: s.lc.Pending(),
		Done:   c,
		Free: func(ctx context.Context) error {
			left, err := s.removeAll(ctx, drop)
			s.quarantine(left)
			return err
		},
	})
	if err == nil {
		return c, nil
	}
	s.mu.Lock()
	s.shrinks = slices.DeleteFunc(s.shrinks, func(x *ep.Completion) bool { return x == c })
	s.mu.Unlock()
	s.quarantine(drop)
	return nil, &memapi.Error{Op: op, Kind: ep.ErrQuarantined, Authority: s.d.authority, Wanted: wanted,
		Detail: "the release could not be scheduled; the backing stays charged until a retry removes it", Err: err}
}

// quarantine books segments whose removal failed as quarantined and keeps
// them for a retry.
func (s *regionState) quarantine(left []segment) {
	for i := range left {
		if sg := &left[i]; !sg.quar && sg.lease != (governor.Lease{}) {
			sg.quar = sg.lease.Quarantine(sg.r.Len) == nil
		}
	}
	s.mu.Lock()
	s.quar = append(s.quar, left...)
	slices.SortFunc(s.quar, func(x, y segment) int { return cmpOff(x.r.Off, y.r.Off) })
	s.mu.Unlock()
}

// removeAll releases segments in address order, top first, and returns
// those it could not remove. Adjacent private commits are decommitted by one
// call (one mprotect and one madvise for the whole run instead of one per
// growth step), its refund split over their accounts.
func (s *regionState) removeAll(ctx context.Context, segs []segment) ([]segment, error) {
	var errs []error
	var left []segment
	for end := len(segs); end > 0; {
		start := end - 1
		if segs[start].joins() {
			for start > 0 && segs[start-1].joins() && segs[start-1].r.Off+segs[start-1].r.Len == segs[start].r.Off {
				start--
			}
		}
		run := segs[start:end]
		var err error
		if len(run) == 1 {
			err = s.remove(ctx, &run[0])
		} else {
			last := run[len(run)-1].r
			rng := memapi.Range{Off: run[0].r.Off, Len: last.Off + last.Len - run[0].r.Off}
			err = s.vb.Decommit(ctx, s.res, rng, s.split(run))
		}
		if err != nil {
			errs = append(errs, err)
			left = append(owing(run), left...)
		} else {
			for _, sg := range run {
				if sg.grant != (governor.Grant{}) {
					errs = append(errs, sg.grant.Cancel())
				}
			}
		}
		end = start
	}
	return left, errors.Join(errs...)
}

// owing returns the segments of a run whose removal failed that are still
// to remove: all but the private commits whose lease holds nothing. Those
// were refunded, and a refund follows the free of the memory (the checked
// wrapper refunds after the mechanism's success), so nothing of them is
// left; an emptied lease refuses any further refund (its record ended),
// and is never used again.
func owing(run []segment) []segment {
	left := make([]segment, 0, len(run))
	for _, sg := range run {
		if sg.committed() && sg.lease != (governor.Lease{}) && sg.lease.Bytes() == 0 {
			continue
		}
		left = append(left, sg)
	}
	return left
}

// split is the governor's account that refunds a decommit of adjacent
// commits to each one's account, in address order, by the bytes each held.
func (s *regionState) split(run []segment) memapi.Account {
	parts := make([]governor.Part, len(run))
	for i, p := range run {
		parts[i] = governor.Part{Account: p.account(), Bytes: p.r.Len}
	}
	return s.bind.m.g.Split(s.d.authority, parts)
}

// remove releases one segment: decommit private memory (refunding its
// account), or unmap a view (dropping the shared reference, or releasing
// the private backing of a copy-on-write view). What it did stays done: a
// view unmapped before its backing's release failed is not unmapped again
// by the retry.
func (s *regionState) remove(ctx context.Context, sg *segment) error {
	if sg.hole {
		return nil
	}
	if sg.view == nil && !sg.unmapped {
		err := s.vb.Decommit(ctx, s.res, sg.r, sg.account())
		if sg.quar && errors.Is(err, memapi.ErrNotCommitted) {
			// The memory of a piece quarantined by a release whose
			// refund failed is already freed: only the refund is left.
			return sg.account().Refund(sg.r.Len)
		}
		return err
	}
	sm, err := memapi.RequireSharedMapping(s.mech)
	if err != nil {
		return err
	}
	if !sg.unmapped {
		sg.backing = sg.view.Backing()
		if err := sm.UnmapView(ctx, sg.view); err != nil {
			return err
		}
		sg.unmapped, sg.view = true, nil
	}
	if sg.shared != nil {
		// The view's hold ends whatever happens to the shared
		// backing's own release, which its lifecycle carries.
		_ = sg.shared.drop(nil)
		return nil
	}
	return sm.ReleaseBacking(ctx, sg.backing, sg.account())
}

// Closed is the region's ep.Releaser.Closed: the binding uncounts it.
func (s *regionState) Closed() { s.bind.release() }

// Free is the region's ep.Releaser.Free: releaseAll.
func (s *regionState) Free(ctx context.Context) error { return s.releaseAll(ctx) }

// Pending is the region's ep.Releaser.Pending: every lease's bytes wait
// for the fences. Quarantined ones are already booked apart.
func (s *regionState) Pending() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sg := range s.segs {
		if sg.lease != (governor.Lease{}) && !sg.quar {
			_ = sg.lease.MarkPending(sg.r.Len)
		}
	}
}

// releaseAll is the region's release: it runs on the queue after the
// region's fences, which include the completions of its shrinks, so no
// shrink is still to run. What it cannot remove is quarantined and removed
// again by the retry.
func (s *regionState) releaseAll(ctx context.Context) error {
	s.mu.Lock()
	segs := append(s.segs, s.quar...)
	s.segs, s.quar, s.top = nil, nil, 0
	s.mu.Unlock()
	slices.SortFunc(segs, func(x, y segment) int { return cmpOff(x.r.Off, y.r.Off) })
	left, err := s.removeAll(ctx, segs)
	if err != nil {
		s.quarantine(left)
		return err
	}
	if s.resGone {
		return nil
	}
	if err := s.vb.ReleaseReservation(ctx, s.res, s.bind.m.g.Split(s.d.authority, nil)); err != nil {
		return err
	}
	s.resGone = true
	return nil
}

func cmpOff(x, y memapi.Bytes) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}
