package pmm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
)

// Shared is a physical backing (SharedMapping) created once and charged
// once to its creating holder, mappable read-only into many regions. It is
// freed and refunded when its owner closed it and its last view is gone.
type Shared struct {
	bind    *Binding
	d       *device
	sm      memapi.SharedMapping
	backing *memapi.Backing
	lease   Lease
	once    sync.Once

	mu       sync.Mutex
	views    int
	closed   bool
	released bool
}

// CreateShared creates a backing of size bytes (rounded up to the
// granularity), charged to the binding's holder. Without SharedMapping it
// returns an error for which errors.Is(err, errors.ErrUnsupported) holds.
func (b *Binding) CreateShared(ctx context.Context, size memapi.Bytes) (*Shared, error) {
	return counted(b, "pmm.CreateShared", func(d *device) (*Shared, error) { return b.createShared(ctx, d, size) })
}

func (b *Binding) createShared(ctx context.Context, d *device, size memapi.Bytes) (*Shared, error) {
	sm, err := memapi.RequireSharedMapping(d.mech)
	if err != nil {
		return nil, err
	}
	n, ok := memapi.RoundUp(size, d.mech.Info().Granularity)
	if size == 0 || !ok {
		return nil, &memapi.Error{Op: "pmm.CreateShared", Kind: memapi.ErrInvalidSize, Wanted: size}
	}
	g, err := b.reserve(ctx, d, n)
	if err != nil {
		return nil, err
	}
	bk, err := sm.CreateBacking(ctx, size, g)
	if err != nil {
		return nil, cancel(g, err)
	}
	undo := func(err error, to memapi.Account) error {
		if rerr := sm.ReleaseBacking(ctx, bk, to); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	lease, err := g.Commit()
	if err != nil {
		return nil, cancel(g, undo(err, g))
	}
	if err := d.ctx.Pin(); err != nil {
		return nil, undo(err, lease)
	}
	return &Shared{bind: b, d: d, sm: sm, backing: bk, lease: lease}, nil
}

// Size returns the backing's size: the bytes charged once.
func (s *Shared) Size() memapi.Bytes { return s.backing.Size() }

// Views returns how many views of the backing are mapped.
func (s *Shared) Views() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.views
}

// Close drops the owner's reference. The backing is freed and its lease
// refunded once the last view is gone too. Idempotent.
func (s *Shared) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	last := s.views == 0
	s.mu.Unlock()
	s.once.Do(s.bind.release)
	if last {
		return s.free(nil)
	}
	return nil
}

// acquire counts a new view; it fails once the owner closed the backing.
func (s *Shared) acquire(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return memapi.Errorf(op, memapi.ErrClosed, "shared backing is closed")
	}
	s.views++
	return nil
}

// drop uncounts a view; the last one after Close frees the backing behind
// fences.
func (s *Shared) drop(fences []memapi.Fence) {
	s.mu.Lock()
	s.views--
	last := s.views == 0 && s.closed
	s.mu.Unlock()
	if last {
		_ = s.free(fences)
	}
}

func (s *Shared) free(fences []memapi.Fence) error {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return nil
	}
	s.released = true
	s.mu.Unlock()
	_ = s.lease.MarkPending(s.backing.Size())
	return s.d.ctx.Queue().Enqueue(ep.Release{
		Name:   fmt.Sprintf("shared backing %v", s.backing),
		Fences: fences,
		Free: func(ctx context.Context) error {
			if err := s.sm.ReleaseBacking(ctx, s.backing, s.lease); err != nil {
				return err
			}
			s.d.ctx.Unpin()
			return nil
		},
	})
}

// MapShared maps the whole shared backing at the region's current end with
// the given access (read-only for a shared prefix) and returns the range it
// occupies. Nothing is charged: the backing was charged once at creation.
func (r *Region) MapShared(ctx context.Context, s *Shared, access memapi.Access) (memapi.Range, error) {
	const op = "pmm.Region.MapShared"
	if s.sm == nil || s.d.mech.Info().Instance != r.mech.Info().Instance {
		return memapi.Range{}, memapi.Errorf(op, memapi.ErrForeignHandle, "backing and region come from different mechanism instances")
	}
	if err := r.begin(ctx, op); err != nil {
		return memapi.Range{}, err
	}
	defer r.end()
	rng := memapi.Range{Off: r.Len(), Len: s.Size()}
	if !rng.Within(r.res.Size()) {
		return memapi.Range{}, &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: rng.Off + rng.Len, Available: r.res.Size()}
	}
	if err := s.acquire(op); err != nil {
		return memapi.Range{}, err
	}
	v, err := s.sm.MapView(ctx, r.res, rng, s.backing, access)
	if err != nil {
		s.mu.Lock()
		s.views--
		s.mu.Unlock()
		return memapi.Range{}, err
	}
	r.mu.Lock()
	r.segs = append(r.segs, segment{r: rng, view: v, shared: s})
	r.top = rng.Off + rng.Len
	r.mu.Unlock()
	return rng, nil
}

// CopyOnWrite gives the region a private, read-write copy of the shared view
// that holds offset off: a new backing charged to the region's holder,
// holding a copy of the bytes, mapped at the same addresses. Other views are
// unchanged. On failure the region keeps its shared view and the grant is
// returned. The caller must have no device work in flight on the range.
func (r *Region) CopyOnWrite(ctx context.Context, off memapi.Bytes) error {
	const op = "pmm.Region.CopyOnWrite"
	if err := r.begin(ctx, op); err != nil {
		return err
	}
	defer r.end()
	r.mu.Lock()
	idx := -1
	for i, s := range r.segs {
		if off >= s.r.Off && off < s.r.Off+s.r.Len {
			idx = i
			break
		}
	}
	var seg segment
	if idx >= 0 {
		seg = r.segs[idx]
	}
	r.mu.Unlock()
	if idx < 0 || seg.shared == nil {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: off, Detail: "offset is not in a shared view"}
	}
	sm := seg.shared.sm
	g, err := r.bind.reserve(ctx, r.d, seg.r.Len)
	if err != nil {
		return err
	}
	oldAccess := seg.view.Access()
	nv, err := sm.CopyOnWrite(ctx, seg.view, g)
	if err != nil {
		return cancel(g, err)
	}
	lease, err := g.Commit()
	if err != nil {
		// Undo: drop the private copy (refunding the grant), map the shared
		// backing back as it was.
		bk := nv.Backing()
		uerr := sm.UnmapView(ctx, nv)
		if uerr == nil {
			uerr = sm.ReleaseBacking(ctx, bk, g)
		}
		ov, merr := sm.MapView(ctx, r.res, seg.r, seg.shared.backing, oldAccess)
		if uerr != nil || merr != nil {
			return errors.Join(err, uerr, merr)
		}
		r.mu.Lock()
		r.segs[idx].view = ov
		r.mu.Unlock()
		return cancel(g, err)
	}
	r.mu.Lock()
	r.segs[idx] = segment{r: seg.r, view: nv, lease: lease}
	r.mu.Unlock()
	seg.shared.drop(r.Pending())
	return nil
}
