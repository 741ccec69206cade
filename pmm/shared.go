package pmm

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// Shared is a physical backing (SharedMapping) created once and charged
// once to its creating holder, mappable read-only into many regions. Its
// lifecycle is ep.Lifecycle's, each view holding it open: after Close (or
// the leak backstop) no view is added, and the backing is freed and refunded
// behind the fences of its last view's use once that view is gone.
type Shared struct {
	ep.Owned
	s *sharedState
}

// sharedState is what the views and the release need; it never refers to
// the Shared handle, so the leak backstop can run while views remain.
type sharedState struct {
	lc      *ep.Lifecycle
	bind    *Binding
	d       *device
	sm      memapi.SharedMapping
	backing *memapi.Backing
	lease   governor.Lease
	quar    bool // set by a failed release, read by its retry (both on the queue)
}

// CreateShared creates a backing of size bytes (rounded up to the
// granularity), charged to the binding's holder. Without SharedMapping it
// returns an error for which errors.Is(err, errors.ErrUnsupported) holds.
func (b *Binding) CreateShared(ctx context.Context, size memapi.Bytes) (*Shared, error) {
	var site *ep.Site
	if b.m.opts.RecordSites {
		site = new(ep.Site)
		runtime.Callers(2, site[:])
	}
	d, err := b.begin("pmm.CreateShared")
	if err != nil {
		return nil, err
	}
	h, err := b.createShared(ctx, d, size, site)
	if err != nil {
		b.release()
	}
	return h, err
}

func (b *Binding) createShared(ctx context.Context, d *device, size memapi.Bytes, site *ep.Site) (*Shared, error) {
	sm, err := memapi.RequireSharedMapping(d.mech)
	if err != nil {
		return nil, err
	}
	n, ok := memapi.RoundUp(size, d.info.Granularity)
	if size == 0 || !ok {
		return nil, &memapi.Error{Op: "pmm.CreateShared", Kind: memapi.ErrInvalidSize, Wanted: size}
	}
	r := b.req
	r.Authority, r.Bytes = d.authority, n
	g, err := b.m.g.Reserve(ctx, r)
	if err != nil {
		return nil, err
	}
	bk, err := sm.CreateBacking(ctx, size, g)
	if err != nil {
		return nil, cancel(d, fmt.Sprintf("%s/%s shared grant of %d bytes", b.holder, b.role, n), g, err)
	}
	lease, err := g.Commit()
	if err != nil {
		if rerr := sm.ReleaseBacking(ctx, bk, g); rerr != nil {
			return nil, keepRollback(d, fmt.Sprintf("%s/%s shared backing %v (failed rollback)", b.holder, b.role, bk), g, bk.Size(), releaser(sm, bk), errors.Join(err, rerr))
		}
		return nil, cancel(d, fmt.Sprintf("%s/%s shared grant of %d bytes", b.holder, b.role, n), g, err)
	}
	s := &sharedState{bind: b, d: d, sm: sm, backing: bk, lease: lease}
	name := fmt.Sprintf("%s/%s shared backing %v", b.holder, b.role, bk)
	sh := &Shared{s: s}
	if err := d.ctx.OwnIn(&sh.Owned, name, s, ep.Origin{Bytes: bk.Size(), Site: site}); err != nil {
		if rerr := s.Free(ctx); rerr != nil {
			return nil, keepRefused(d, name+" (refused)", s, bk.Size(), errors.Join(err, rerr))
		}
		return nil, err
	}
	s.lc = sh.Lifecycle()
	return sh, nil
}

// releaser releases bk through sm, refunding the account it is given.
func releaser(sm memapi.SharedMapping, bk *memapi.Backing) func(context.Context, memapi.Account) error {
	return func(ctx context.Context, acct memapi.Account) error { return sm.ReleaseBacking(ctx, bk, acct) }
}

// Size returns the backing's size: the bytes charged once.
func (s *Shared) Size() memapi.Bytes { return s.s.backing.Size() }

// Views returns how many views of the backing are mapped.
func (s *Shared) Views() int { return s.s.lc.Holds() }

// Close ends the shared backing: no view is added after it, and the
// backing is freed and refunded behind the fences of its last view's use
// once that view is gone; it returns without waiting. On a quarantined
// backing it retries the release; otherwise a second Close returns nil.
func (s *Shared) Close() error { return s.Owned.Close() }

// RecordUse records a fence of device work that uses the backing: it is
// released only after the fence completes. It fails with
// memapi.ErrReleased once the release is scheduled.
func (s *Shared) RecordUse(f memapi.Fence) error { return s.Owned.RecordUse(f) }

// State returns where the shared backing is in its lifecycle
// (ep.Lifecycle).
func (s *Shared) State() ep.State { return s.Owned.State() }

// Err returns the error of the backing's last failed release (of kind
// ep.ErrQuarantined) while it is quarantined, else nil.
func (s *Shared) Err() error { return s.Owned.Err() }

// Retry queues the release of a quarantined shared backing again; on any
// other it does nothing and returns nil.
func (s *Shared) Retry() error { return s.Owned.Retry() }

// Closed, Pending and Free are the backing's ep.Releaser: uncount it from
// its binding, mark its lease pending, release it.
func (s *sharedState) Closed() { s.bind.release() }

func (s *sharedState) Pending() { _ = s.lease.MarkPending(s.backing.Size()) }

func (s *sharedState) Free(ctx context.Context) error {
	acct := memapi.Account(s.lease)
	if s.quar {
		acct = s.lease.QuarantinedAccount()
	}
	if err := s.sm.ReleaseBacking(ctx, s.backing, acct); err != nil {
		if !s.quar {
			s.quar = s.lease.Quarantine(s.backing.Size()) == nil
		}
		return err
	}
	return nil
}

// drop ends a view's hold; the fences are the region's work that may still
// read the view. The last one after Close schedules the free behind them.
func (s *sharedState) drop(fences []memapi.Fence) error { return s.lc.End(fences...) }

// MapShared maps the whole shared backing at the region's current end with
// the given access (read-only for a shared prefix) and returns the range it
// occupies. Nothing is charged: the backing was charged once at creation.
func (r *Region) MapShared(ctx context.Context, sh *Shared, access memapi.Access) (memapi.Range, error) {
	const op = "pmm.Region.MapShared"
	rs, s := r.s, sh.s
	if s.sm == nil || s.d.mech.Info().Instance != rs.mech.Info().Instance {
		return memapi.Range{}, memapi.Errorf(op, memapi.ErrForeignHandle, "backing and region come from different mechanism instances")
	}
	if err := rs.begin(ctx, op); err != nil {
		return memapi.Range{}, err
	}
	defer rs.end()
	rng := memapi.Range{Off: rs.len(), Len: s.backing.Size()}
	if !rng.Within(rs.res.Size()) {
		return memapi.Range{}, &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: rng.Off + rng.Len, Available: rs.res.Size()}
	}
	if err := rs.settleQuarantine(ctx, op, rng); err != nil {
		return memapi.Range{}, err
	}
	if err := s.lc.Begin(op); err != nil {
		return memapi.Range{}, err
	}
	v, err := s.sm.MapView(ctx, rs.res, rng, s.backing, access)
	if err != nil {
		return memapi.Range{}, errors.Join(err, s.lc.End())
	}
	rs.mu.Lock()
	rs.segs = append(rs.segs, segment{r: rng, view: v, shared: s})
	rs.top = rng.Off + rng.Len
	rs.mu.Unlock()
	return rng, nil
}

// CopyOnWrite gives the region a private, read-write copy of the shared view
// that holds offset off: a new backing charged to the region's holder,
// holding a copy of the bytes, mapped at the same addresses. Other views are
// unchanged; the shared reference is dropped behind the region's fences. On
// failure the region keeps its shared view and the grant is returned; when
// the undo itself fails, what could not be undone stays accounted (the copy
// kept with its grant, or the range left unbacked, its shared reference
// dropped) and the error says so. The caller must have no device work in
// flight on the range.
func (r *Region) CopyOnWrite(ctx context.Context, off memapi.Bytes) error {
	const op = "pmm.Region.CopyOnWrite"
	rs := r.s
	if err := rs.begin(ctx, op); err != nil {
		return err
	}
	var after []memapi.Fence
	defer func() { rs.end(after...) }()
	rs.mu.Lock()
	idx := -1
	for i, s := range rs.segs {
		if off >= s.r.Off && off < s.r.Off+s.r.Len {
			idx = i
			break
		}
	}
	var seg segment
	if idx >= 0 {
		seg = rs.segs[idx]
	}
	rs.mu.Unlock()
	if idx < 0 || seg.shared == nil {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: off, Detail: "offset is not in a shared view"}
	}
	sm := seg.shared.sm
	req := rs.bind.req
	req.Authority, req.Bytes = rs.d.authority, seg.r.Len
	g, err := rs.bind.m.g.Reserve(ctx, req)
	if err != nil {
		return err
	}
	oldAccess := seg.view.Access()
	nv, err := sm.CopyOnWrite(ctx, seg.view, g)
	if err != nil {
		return cancel(rs.d, rs.grantName(seg.r), g, err)
	}
	lease, err := g.Commit()
	if err != nil {
		// Undo: drop the private copy (refunding the grant), map the shared
		// backing back as it was.
		bk := nv.Backing()
		if uerr := sm.UnmapView(ctx, nv); uerr != nil {
			// The copy stays mapped, drawn from the open grant: the
			// region keeps it as a private view, removed (and the grant
			// undrawn and cancelled) by its release.
			rs.mu.Lock()
			rs.segs[idx] = segment{r: seg.r, view: nv, grant: g}
			rs.mu.Unlock()
			return errors.Join(err, uerr, seg.shared.drop(rs.lc.Pending()))
		}
		if rerr := sm.ReleaseBacking(ctx, bk, g); rerr != nil {
			name := fmt.Sprintf("%s/%s copy-on-write backing %v (failed rollback)", rs.bind.holder, rs.bind.role, bk)
			err = errors.Join(err, keepRollback(rs.d, name, g, bk.Size(), releaser(sm, bk), rerr))
		} else {
			err = cancel(rs.d, rs.grantName(seg.r), g, err)
		}
		ov, merr := sm.MapView(ctx, rs.res, seg.r, seg.shared.backing, oldAccess)
		if merr != nil {
			// Nothing is mapped at the range any more: a hole the
			// region's release skips, its shared reference dropped.
			rs.mu.Lock()
			rs.segs[idx] = segment{r: seg.r, hole: true}
			rs.mu.Unlock()
			return errors.Join(err, &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: seg.r.Len,
				Detail: "the shared view could not be mapped back; the range is unbacked", Err: merr}, seg.shared.drop(rs.lc.Pending()))
		}
		rs.mu.Lock()
		rs.segs[idx].view = ov
		rs.mu.Unlock()
		return err
	}
	rs.mu.Lock()
	rs.segs[idx] = segment{r: seg.r, view: nv, lease: lease}
	rs.mu.Unlock()
	return seg.shared.drop(rs.lc.Pending())
}
