//go:build memgentmpl

// memgen:needs SharedMapping VirtualBacking

package fakes

import (
	"context"

	memapi "github.com/memgen/memgen/generated/memapi"
)

type backingState struct {
	mem   *store
	views int
}

type viewState struct {
	res    *resState
	first  uint64 // first granule in the reservation
	n      uint64 // granules
	b      *backingState
	access memapi.Access
}

// CreateBacking makes zeroed host memory mapped nowhere yet.
func (s *mechanismState) CreateBacking(
	ctx context.Context,
	size memapi.Bytes,
	grant memapi.Grant,
) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, s.errorf(op, memapi.ErrNoGrant, 0, "a consuming call needs a grant")
	}
	if err := s.ctxErr(op, ctx); err != nil {
		return nil, err
	}
	n, err := s.size(op, size, s.cfg.Granularity)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.charge(op, n); err != nil {
		return nil, err
	}
	s.used += n
	s.live++
	return s.issuer.NewBacking(n, &backingState{mem: newStore(uint64(n))}), nil
}

// MapView points every granule of r at b's memory.
func (s *mechanismState) MapView(
	ctx context.Context,
	res *memapi.Reservation,
	r memapi.Range,
	b *memapi.Backing,
	access memapi.Access,
) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	if err := s.ctxErr(op, ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ri, err := s.issuer.Impl(op, res)
	if err != nil {
		return nil, s.fill(err)
	}
	bi, err := s.issuer.Impl(op, b)
	if err != nil {
		return nil, s.fill(err)
	}
	rs, bs := ri.(*resState), bi.(*backingState)
	if !access.Valid() {
		return nil, s.errorf(op, memapi.ErrUnsupported, 0, "access %v is not supported", access)
	}
	if err := s.checkRange(op, res.ID(), res.Size(), r); err != nil {
		return nil, err
	}
	if r.Len != b.Size() {
		return nil, s.errorf(
			op,
			memapi.ErrInvalidSize,
			b.ID(),
			"range %v is %d bytes, the backing %d",
			r,
			r.Len,
			b.Size(),
		)
	}
	first, n := s.granules(r)
	for i := first; i < first+n; i++ {
		if rs.slots[i] != nil {
			return nil, s.errorf(
				op,
				memapi.ErrCommitted,
				res.ID(),
				"offset %#x already has backing",
				i*uint64(s.cfg.Granularity),
			)
		}
	}
	vs := &viewState{res: rs, first: first, n: n, b: bs, access: access}
	s.bind(vs)
	bs.views++
	rs.views++
	s.live++
	return s.issuer.NewView(res, r, b, access, vs), nil
}

func (s *mechanismState) bind(vs *viewState) {
	sl := &slot{view: vs}
	for i := vs.first; i < vs.first+vs.n; i++ {
		vs.res.slots[i] = sl
	}
}

func (s *mechanismState) unbind(vs *viewState) {
	for i := vs.first; i < vs.first+vs.n; i++ {
		delete(vs.res.slots, i)
	}
}

// UnmapView leaves the range reserved with no backing; the backing lives on.
func (s *mechanismState) UnmapView(ctx context.Context, v *memapi.View) error {
	const op = "SharedMapping.UnmapView"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.BeginRelease(op, v)
	if err != nil {
		return s.fill(err)
	}
	vs := impl.(*viewState)
	s.unbind(vs)
	vs.b.views--
	vs.res.views--
	s.live--
	s.issuer.EndRelease(v, true)
	return nil
}

// CopyOnWrite copies v's bytes into a new backing and remaps v's range to it
// read-write.
func (s *mechanismState) CopyOnWrite(
	ctx context.Context,
	v *memapi.View,
	grant memapi.Grant,
) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, s.errorf(op, memapi.ErrNoGrant, v.ID(), "a consuming call needs a grant")
	}
	if err := s.ctxErr(op, ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.Impl(op, v)
	if err != nil {
		return nil, s.fill(err)
	}
	old := impl.(*viewState)
	n := v.Range().Len
	if err := s.charge(op, n); err != nil {
		return nil, err
	}
	if err := s.issuer.Retire(op, v); err != nil {
		return nil, s.fill(err)
	}
	bs := &backingState{mem: old.b.mem.clone(), views: 1}
	nb := s.issuer.NewBacking(n, bs)
	vs := &viewState{res: old.res, first: old.first, n: old.n, b: bs, access: memapi.AccessReadWrite}
	s.bind(vs)
	old.b.views--
	s.used += n
	s.live++ // a new backing; the new view replaces the old one
	return s.issuer.NewView(v.Reservation(), v.Range(), nb, memapi.AccessReadWrite, vs), nil
}

// ViewCount counts the mapped views of b.
func (s *mechanismState) ViewCount(b *memapi.Backing) (int, error) {
	const op = "SharedMapping.ViewCount"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.Impl(op, b)
	if err != nil {
		return 0, s.fill(err)
	}
	return impl.(*backingState).views, nil
}

// ReleaseBacking drops b's memory once no view maps it.
func (s *mechanismState) ReleaseBacking(ctx context.Context, b *memapi.Backing, to memapi.Account) error {
	const op = "SharedMapping.ReleaseBacking"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.BeginRelease(op, b)
	if err != nil {
		return s.fill(err)
	}
	if bs := impl.(*backingState); bs.views > 0 {
		s.issuer.EndRelease(b, false)
		return s.errorf(op, memapi.ErrInUse, b.ID(), "%d views of the backing are mapped", bs.views)
	}
	s.used -= b.Size()
	s.live--
	s.issuer.EndRelease(b, true)
	return nil
}
