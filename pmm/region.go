package pmm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// segment is one backed piece of a region, in address order: private
// committed memory (with its lease), a view of a Shared backing, or the
// private view a copy-on-write made (with the lease of its new backing).
type segment struct {
	r      memapi.Range
	lease  Lease        // commit and copy-on-write segments
	view   *memapi.View // view segments
	shared *Shared      // view of a shared backing; nil for a copy-on-write view
}

// Region is a growable range of device addresses (VirtualBacking): the
// address never moves while backing is installed and removed behind it. It
// is backed contiguously from its start up to Len, by private commits and by
// views of shared backings.
type Region struct {
	*ep.Owned
	bind *Binding
	d    *device
	mech memapi.Mechanism
	vb   memapi.VirtualBacking
	res  *memapi.Reservation
	gran memapi.Bytes
	once sync.Once

	txn chan struct{} // serializes transactions; taken with the caller's ctx

	mu       sync.Mutex
	segs     []segment
	top      memapi.Bytes
	draining int
	drained  chan struct{} // closed while draining == 0
	closed   bool
}

// ReserveVirtual reserves max bytes of addresses for a growable region. When
// the device's mechanism lacks VirtualBacking it returns an error for which
// errors.Is(err, errors.ErrUnsupported) holds: the caller then chooses its
// explicit fallback (e.g. Allocate the maximum eagerly).
func (b *Binding) ReserveVirtual(ctx context.Context, max memapi.Bytes) (*Region, error) {
	return counted(b, "pmm.ReserveVirtual", func(d *device) (*Region, error) { return b.reserveVirtual(ctx, d, max) })
}

func (b *Binding) reserveVirtual(ctx context.Context, d *device, max memapi.Bytes) (*Region, error) {
	vb, err := memapi.RequireVirtualBacking(d.mech)
	if err != nil {
		return nil, err
	}
	res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: max})
	if err != nil {
		return nil, err
	}
	r := &Region{bind: b, d: d, mech: d.mech, vb: vb, res: res, gran: d.mech.Info().Granularity,
		txn: make(chan struct{}, 1), drained: make(chan struct{})}
	close(r.drained)
	owned, err := d.ctx.Own(fmt.Sprintf("%s/%s region %#x", b.holder, b.role, res.Addr()), r.markPending, r.releaseAll)
	if err != nil {
		return nil, errors.Join(err, vb.ReleaseReservation(ctx, res, zeroAccount(d.authority)))
	}
	r.Owned = owned
	return r, nil
}

// Addr returns the region's stable base address.
func (r *Region) Addr() memapi.DeviceAddr { return r.res.Addr() }

// Cap returns the bytes of address space reserved.
func (r *Region) Cap() memapi.Bytes { return r.res.Size() }

// Len returns the bytes backed from the start of the region.
func (r *Region) Len() memapi.Bytes {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.top
}

// Granularity returns the unit in which the region grows.
func (r *Region) Granularity() memapi.Bytes { return r.gran }

func (r *Region) begin(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "context ended before the transaction began", Err: err}
	}
	select {
	case r.txn <- struct{}{}:
	case <-ctx.Done():
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "region busy", Err: ctx.Err()}
	}
	r.mu.Lock()
	closed, drained := r.closed, r.drained
	r.mu.Unlock()
	if closed {
		<-r.txn
		return memapi.Errorf(op, memapi.ErrClosed, "region is closed")
	}
	// Backing removed by an earlier Shrink may still wait for its fences:
	// the range is not reusable until it is really gone.
	select {
	case <-drained:
		return nil
	case <-ctx.Done():
		<-r.txn
		return &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "earlier shrink still waits for fences", Err: ctx.Err()}
	}
}

func (r *Region) end() { <-r.txn }

// Grow backs the region up to newLen bytes (rounded up to the granularity)
// as one transaction: grant → commit the new range → update(newLen), the
// holder's view → commit the charge. On any failure the range is decommitted,
// the grant returned, update is called again with the old length if it had
// run, and the region is as before. Growing to at most Len only calls update.
func (r *Region) Grow(ctx context.Context, newLen memapi.Bytes, update func(newLen memapi.Bytes) error) error {
	const op = "pmm.Region.Grow"
	if err := r.begin(ctx, op); err != nil {
		return err
	}
	defer r.end()
	old := r.Len()
	newTop, ok := memapi.RoundUp(newLen, r.gran)
	if !ok || newTop > r.res.Size() {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: newLen, Available: r.res.Size(), Detail: "beyond the reserved range"}
	}
	if newTop <= old {
		if update != nil {
			return update(newLen)
		}
		return nil
	}
	rng := memapi.Range{Off: old, Len: newTop - old}
	g, err := r.bind.reserve(ctx, r.d, rng.Len)
	if err != nil {
		return err
	}
	if err := r.vb.Commit(ctx, r.res, rng, g); err != nil {
		return cancel(g, err)
	}
	rollback := func(err error, viewUpdated bool) error {
		if viewUpdated {
			err = errors.Join(err, update(old))
		}
		if derr := r.vb.Decommit(ctx, r.res, rng, g); derr != nil {
			return errors.Join(err, derr) // the grant keeps the bytes drawn: nothing is lost
		}
		return cancel(g, err)
	}
	if update != nil {
		if err := update(newLen); err != nil {
			return rollback(err, false)
		}
	}
	lease, err := g.Commit()
	if err != nil {
		return rollback(err, update != nil)
	}
	r.mu.Lock()
	r.segs = append(r.segs, segment{r: rng, lease: lease})
	r.top = newTop
	r.mu.Unlock()
	return nil
}

// Shrink removes backing above newLen (rounded up to the granularity; a
// view is removed whole, so newLen rounds up to the end of a view it cuts).
// update(newLen) runs first, so the holder stops using the range; the removed
// backing is released behind the region's recorded fences, its lease pending
// until then. A failing update changes nothing.
func (r *Region) Shrink(ctx context.Context, newLen memapi.Bytes, update func(newLen memapi.Bytes) error) error {
	const op = "pmm.Region.Shrink"
	if err := r.begin(ctx, op); err != nil {
		return err
	}
	defer r.end()
	newTop, ok := memapi.RoundUp(newLen, r.gran)
	if !ok {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: newLen}
	}
	r.mu.Lock()
	if newTop >= r.top {
		r.mu.Unlock()
		if update != nil {
			return update(newLen)
		}
		return nil
	}
	// Find the cut: whole views stay whole.
	keep := len(r.segs)
	for keep > 0 && r.segs[keep-1].r.Off >= newTop {
		keep--
	}
	var partial *segment
	if keep > 0 {
		s := &r.segs[keep-1]
		if end := s.r.Off + s.r.Len; end > newTop {
			if s.view != nil {
				newTop = end
			} else {
				partial = s
			}
		}
	}
	r.mu.Unlock()
	if update != nil {
		if err := update(newLen); err != nil {
			return err
		}
	}
	r.mu.Lock()
	var drop []segment
	if partial != nil {
		cut := partial.r.Off + partial.r.Len - newTop
		drop = append(drop, segment{r: memapi.Range{Off: newTop, Len: cut}, lease: partial.lease})
		partial.r.Len -= cut
	}
	drop = append(drop, r.segs[keep:]...)
	for i := keep; i < len(r.segs); i++ {
		r.segs[i] = segment{}
	}
	r.segs = r.segs[:keep]
	r.top = newTop
	for _, s := range drop {
		if s.lease != nil {
			_ = s.lease.MarkPending(s.r.Len)
		}
	}
	if r.draining == 0 {
		r.drained = make(chan struct{})
	}
	r.draining++
	r.mu.Unlock()
	return r.d.ctx.Queue().Enqueue(ep.Release{
		Name:   fmt.Sprintf("shrink of region %#x to %d", r.res.Addr(), newTop),
		Fences: r.Pending(),
		Free: func(ctx context.Context) error {
			defer r.drainDone()
			return r.removeAll(ctx, drop)
		},
	})
}

func (r *Region) drainDone() {
	r.mu.Lock()
	r.draining--
	if r.draining == 0 {
		close(r.drained)
	}
	r.mu.Unlock()
}

// removeAll releases segments in address order, top first. Adjacent private
// commits are decommitted by one call (one mprotect and one madvise for the
// whole run instead of one per growth step), its refund split over their
// leases.
func (r *Region) removeAll(ctx context.Context, segs []segment) error {
	var errs []error
	for end := len(segs); end > 0; {
		start := end - 1
		if segs[start].view == nil {
			for start > 0 && segs[start-1].view == nil && segs[start-1].r.Off+segs[start-1].r.Len == segs[start].r.Off {
				start--
			}
		}
		run := segs[start:end]
		if len(run) == 1 {
			errs = append(errs, r.remove(ctx, run[0]))
		} else {
			last := run[len(run)-1].r
			rng := memapi.Range{Off: run[0].r.Off, Len: last.Off + last.Len - run[0].r.Off}
			errs = append(errs, r.vb.Decommit(ctx, r.res, rng, splitAccount{auth: r.d.authority, parts: run}))
		}
		end = start
	}
	return errors.Join(errs...)
}

// splitAccount refunds a decommit of adjacent commits to each one's lease,
// in address order, by the bytes each held.
//
//memvet:allow it issues nothing: it forwards a decommit's refund to the governor leases of the segments it covers
type splitAccount struct {
	auth  memapi.AuthorityID
	parts []segment
}

func (a splitAccount) Authority() memapi.AuthorityID { return a.auth }

func (a splitAccount) Refund(n memapi.Bytes) error {
	var errs []error
	for _, p := range a.parts {
		k := min(n, p.r.Len)
		if k == 0 {
			break
		}
		errs = append(errs, p.lease.Refund(k))
		n -= k
	}
	if n != 0 {
		errs = append(errs, &memapi.Error{Op: "pmm.splitAccount.Refund", Kind: memapi.ErrInvalidSize, Wanted: n, Detail: "refund larger than the decommitted segments"})
	}
	return errors.Join(errs...)
}

// remove releases one segment: decommit private memory (refunding its lease),
// or unmap a view (dropping the shared reference, or releasing the private
// backing of a copy-on-write view).
func (r *Region) remove(ctx context.Context, s segment) error {
	if s.view == nil {
		return r.vb.Decommit(ctx, r.res, s.r, s.lease)
	}
	sm, err := memapi.RequireSharedMapping(r.mech)
	if err != nil {
		return err
	}
	backing := s.view.Backing()
	if err := sm.UnmapView(ctx, s.view); err != nil {
		return err
	}
	if s.shared != nil {
		s.shared.drop(nil)
		return nil
	}
	return sm.ReleaseBacking(ctx, backing, s.lease)
}

func (r *Region) markPending() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, s := range r.segs {
		if s.lease != nil {
			_ = s.lease.MarkPending(s.r.Len)
		}
	}
}

func (r *Region) releaseAll(ctx context.Context) error {
	r.mu.Lock()
	segs := r.segs
	r.segs, r.top = nil, 0
	drained := r.drained
	r.mu.Unlock()
	<-drained // earlier shrinks ran first: the queue orders them
	if err := r.removeAll(ctx, segs); err != nil {
		return err
	}
	return r.vb.ReleaseReservation(ctx, r.res, zeroAccount(r.d.authority))
}

// Close schedules the release of the whole region behind its recorded
// fences: views unmapped, private backing decommitted and refunded, the
// address range freed. It returns at once and is idempotent.
func (r *Region) Close() error {
	err := r.Owned.Close()
	if err == nil {
		r.once.Do(r.bind.release)
	}
	return err
}

// zeroAccount receives the refund of a release that should have nothing left
// to refund; anything else is an accounting error, reported, never dropped.
//
//memvet:allow it issues nothing: a sink that accepts a refund of 0 and reports any other as an error
type zeroAccount memapi.AuthorityID

func (z zeroAccount) Authority() memapi.AuthorityID { return memapi.AuthorityID(z) }

func (z zeroAccount) Refund(n memapi.Bytes) error {
	if n != 0 {
		return &memapi.Error{Op: "pmm.release", Kind: memapi.ErrInvalidSize, Authority: memapi.AuthorityID(z), Wanted: n,
			Detail: "bytes still committed at release had no lease"}
	}
	return nil
}
