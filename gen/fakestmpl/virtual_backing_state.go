//go:build memgentmpl

// memgen:needs VirtualBacking

package fakes

import (
	"context"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// resState is the model of a reservation: its granules, each without
// memgen:if SharedMapping
// backing, privately committed or part of a view.
// memgen:else
// backing, privately committed.
// memgen:end
type resState struct {
	obj       *object
	slots     map[uint64]*slot // by granule index; absent = no backing
	committed memapi.Bytes
	views     int
	eager     *store // LyingEager: the memory taken at Reserve
}

// memgen:if SharedMapping
// slot is one granule of a reservation: privately committed, or part of a view.
// memgen:else
// slot is one granule of a reservation: privately committed.
// memgen:end
type slot struct {
	mem *store
	// memgen:if SharedMapping
	view *viewState
	// memgen:end
}

// Reserve takes address space only (all of it physically when lying eager).
func (s *mechanismState) Reserve(
	ctx context.Context,
	req memapi.ReserveRequest,
) (*memapi.Reservation, error) {
	const op = "VirtualBacking.Reserve"
	if err := s.ctxErr(op, ctx); err != nil {
		return nil, err
	}
	size, err := s.size(op, req.Size, s.cfg.Granularity)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.LyingEager {
		if err := s.charge(op, size); err != nil {
			return nil, err
		}
	}
	rs := &resState{slots: map[uint64]*slot{}}
	rs.obj = &object{r: rs}
	if err := s.place(op, rs.obj, uint64(size), uint64(s.cfg.Granularity)); err != nil {
		return nil, err
	}
	if s.cfg.LyingEager {
		rs.eager = newStore(uint64(size))
		s.used += size
	}
	s.live++
	return s.issuer.NewReservation(memapi.DeviceAddr(rs.obj.base), size, rs), nil
}

// checkRange reports ErrInvalidRange for an empty range or one outside res,
// and ErrUnaligned for one off the granularity.
func (s *mechanismState) checkRange(op string, h memapi.HandleID, size memapi.Bytes, r memapi.Range) error {
	if !r.Within(size) {
		return s.errorf(
			op,
			memapi.ErrInvalidRange,
			h,
			"range %v is empty or outside the reservation's %d bytes",
			r,
			size,
		)
	}
	if !r.Aligned(s.cfg.Granularity) {
		return s.errorf(
			op,
			memapi.ErrUnaligned,
			h,
			"range %v is not aligned to granularity %d",
			r,
			s.cfg.Granularity,
		)
	}
	return nil
}

// granules returns the granule indexes [first, first+n) of r.
func (s *mechanismState) granules(r memapi.Range) (first, n uint64) {
	g := uint64(s.cfg.Granularity)
	return uint64(r.Off) / g, uint64(r.Len) / g
}

// Commit installs zeroed private memory in every granule of r.
func (s *mechanismState) Commit(
	ctx context.Context,
	res *memapi.Reservation,
	r memapi.Range,
	grant memapi.Grant,
) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return s.errorf(op, memapi.ErrNoGrant, res.ID(), "a consuming call needs a grant")
	}
	if err := s.ctxErr(op, ctx); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.Impl(op, res)
	if err != nil {
		return s.fill(err)
	}
	rs := impl.(*resState)
	if err := s.checkRange(op, res.ID(), res.Size(), r); err != nil {
		return err
	}
	if s.cfg.LyingEager {
		return nil // the lie: success, and nothing moves
	}
	first, n := s.granules(r)
	for i := first; i < first+n; i++ {
		if sl := rs.slots[i]; sl != nil {
			what := "committed"
			// memgen:if SharedMapping
			if sl.view != nil {
				what = "mapped by a view"
			}
			// memgen:end
			return s.errorf(
				op,
				memapi.ErrCommitted,
				res.ID(),
				"offset %#x is already %s",
				i*uint64(s.cfg.Granularity),
				what,
			)
		}
	}
	if err := s.charge(op, r.Len); err != nil {
		return err
	}
	for i := first; i < first+n; i++ {
		rs.slots[i] = &slot{mem: newStore(uint64(s.cfg.Granularity))}
	}
	rs.committed += r.Len
	s.used += r.Len
	return nil
}

// Decommit drops the private memory of every granule of r; its bytes are gone.
func (s *mechanismState) Decommit(
	ctx context.Context,
	res *memapi.Reservation,
	r memapi.Range,
	to memapi.Account,
) error {
	const op = "VirtualBacking.Decommit"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.Impl(op, res)
	if err != nil {
		return s.fill(err)
	}
	rs := impl.(*resState)
	if err := s.checkRange(op, res.ID(), res.Size(), r); err != nil {
		return err
	}
	if s.cfg.LyingEager {
		return nil
	}
	first, n := s.granules(r)
	for i := first; i < first+n; i++ {
		if sl := rs.slots[i]; sl == nil || sl.mem == nil {
			return s.errorf(
				op,
				memapi.ErrNotCommitted,
				res.ID(),
				"offset %#x has no committed backing",
				i*uint64(s.cfg.Granularity),
			)
		}
	}
	for i := first; i < first+n; i++ {
		delete(rs.slots, i)
	}
	rs.committed -= r.Len
	s.used -= r.Len
	return nil
}

// CommittedBytes counts the bytes installed by Commit (views add nothing).
func (s *mechanismState) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	const op = "VirtualBacking.CommittedBytes"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.Impl(op, res)
	if err != nil {
		return 0, s.fill(err)
	}
	return impl.(*resState).committed, nil
}

// ReleaseReservation drops what is committed and the address range.
func (s *mechanismState) ReleaseReservation(
	ctx context.Context,
	res *memapi.Reservation,
	to memapi.Account,
) error {
	const op = "VirtualBacking.ReleaseReservation"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.BeginRelease(op, res)
	if err != nil {
		return s.fill(err)
	}
	rs := impl.(*resState)
	if rs.views > 0 {
		s.issuer.EndRelease(res, false)
		return s.errorf(op, memapi.ErrInUse, res.ID(), "%d views are mapped in the reservation", rs.views)
	}
	s.used -= rs.committed
	if rs.eager != nil {
		s.used -= res.Size()
	}
	s.unplace(rs.obj)
	s.live--
	s.issuer.EndRelease(res, true)
	return nil
}

func (rs *resState) segments(
	s *mechanismState,
	op string,
	base,
	off,
	n uint64,
	write bool,
	buf segments,
) (segments, error) {
	g := uint64(s.cfg.Granularity)
	for stop := off + n; off < stop; {
		gi, in := off/g, off%g
		k := min(g-in, stop-off)
		switch sl := rs.slots[gi]; {
		case sl == nil && rs.eager != nil:
			buf = append(buf, segment{st: rs.eager, off: off, n: k})
		case sl == nil:
			return nil, s.errorf(op, memapi.ErrNotCommitted, 0, "no backing at %#x", base+off)
		case sl.mem != nil:
			buf = append(buf, segment{st: sl.mem, off: in, n: k})
			// memgen:if SharedMapping
		default:
			if write && sl.view.access == memapi.AccessReadOnly {
				return nil, s.errorf(op, memapi.ErrReadOnly, 0, "%#x is mapped by a read-only view", base+off)
			}
			buf = append(buf, segment{st: sl.view.b.mem, off: (gi-sl.view.first)*g + in, n: k})
			// memgen:end
		}
		off += k
	}
	return buf, nil
}
