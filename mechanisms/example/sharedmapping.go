package example

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
)

// SharedMapping: a backing is physical memory mapped nowhere; MapView puts
// it in the slots of a reservation, and the same bytes show through every
// view of it.

// backing is the memory behind one CreateBacking, with the count of its
// mapped views.
type backing struct {
	data  []byte
	views int
}

// view is one mapping of a backing at range r of a reservation.
type view struct {
	b      *backing
	r      memapi.Range
	access memapi.Access
}

// CreateBacking obtains zeroed physical memory rounded up to the
// granularity.
func (m *Mechanism) CreateBacking(_ context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, m.errorf(op, memapi.ErrNoGrant, "a consuming call needs a grant")
	}
	n, err := m.size(op, size, m.info.Granularity)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.hold(op, n); err != nil {
		return nil, err
	}
	return m.iss.NewBacking(n, &backing{data: make([]byte, n)}), nil
}

// MapView maps all of b at r of res, whose granules must all be empty.
func (m *Mechanism) MapView(_ context.Context, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	m.mu.Lock()
	defer m.mu.Unlock()
	bi, err := m.iss.Impl(op, b)
	if err != nil {
		return nil, err
	}
	rs, from, to, err := m.slotsOf(op, res, r)
	if err != nil {
		return nil, err
	}
	if r.Len != b.Size() {
		return nil, m.errorf(op, memapi.ErrInvalidSize, "range of %d bytes for a backing of %d", r.Len, b.Size())
	}
	if !access.Valid() {
		return nil, m.errorf(op, memapi.ErrInvalidRange, "invalid access %v", access)
	}
	for i := from; i < to; i++ {
		if rs.slots[i].data != nil || rs.slots[i].view != nil {
			return nil, m.errorf(op, memapi.ErrCommitted, "granule %d of %v already has backing", i, res)
		}
	}
	return m.mapLocked(rs, res, r, b, bi.(*backing), access, from, to), nil
}

// mapLocked puts a view of bs in slots [from, to) of rs. The caller holds
// m.mu.
func (m *Mechanism) mapLocked(rs *reservation, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, bs *backing, access memapi.Access, from, to int) *memapi.View {
	v := &view{b: bs, r: r, access: access}
	for i := from; i < to; i++ {
		rs.slots[i].view = v
	}
	bs.views++
	return m.iss.NewView(res, r, b, access, v)
}

// UnmapView removes the view; the backing stays.
func (m *Mechanism) UnmapView(_ context.Context, v *memapi.View) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.BeginRelease("SharedMapping.UnmapView", v)
	if err != nil {
		return err
	}
	m.clearView(v, impl.(*view))
	m.iss.EndRelease(v, true)
	return nil
}

// clearView empties the slots of a view and drops its backing's count. The
// caller holds m.mu.
func (m *Mechanism) clearView(v *memapi.View, vs *view) {
	rs := m.areas[v.Reservation().Addr()].(*reservation)
	g := m.info.Granularity
	for i := int(vs.r.Off / g); i < int((vs.r.Off+vs.r.Len)/g); i++ {
		rs.slots[i].view = nil
	}
	vs.b.views--
}

// CopyOnWrite replaces v by a read-write view of a private copy of its
// bytes, a new backing that is charged; the old backing stays for its other
// views.
func (m *Mechanism) CopyOnWrite(_ context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, m.errorf(op, memapi.ErrNoGrant, "a consuming call needs a grant")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	vs := impl.(*view)
	if err := m.hold(op, memapi.Bytes(len(vs.b.data))); err != nil {
		m.iss.EndRelease(v, false)
		return nil, err
	}
	m.clearView(v, vs)
	nb := &backing{data: append([]byte(nil), vs.b.data...)}
	b := m.iss.NewBacking(memapi.Bytes(len(nb.data)), nb)
	rs := m.areas[v.Reservation().Addr()].(*reservation)
	g := m.info.Granularity
	nv := m.mapLocked(rs, v.Reservation(), vs.r, b, nb, memapi.AccessReadWrite, int(vs.r.Off/g), int((vs.r.Off+vs.r.Len)/g))
	m.iss.EndRelease(v, true)
	return nv, nil
}

// ViewCount reports the views of b.
func (m *Mechanism) ViewCount(b *memapi.Backing) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.Impl("SharedMapping.ViewCount", b)
	if err != nil {
		return 0, err
	}
	return impl.(*backing).views, nil
}

// ReleaseBacking frees b. It fails with ErrInUse, and keeps b, while a view
// maps it.
func (m *Mechanism) ReleaseBacking(_ context.Context, b *memapi.Backing, _ memapi.Account) error {
	const op = "SharedMapping.ReleaseBacking"
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.BeginRelease(op, b)
	if err != nil {
		return err
	}
	if n := impl.(*backing).views; n > 0 {
		m.iss.EndRelease(b, false)
		return m.errorf(op, memapi.ErrInUse, "%d views mapped", n)
	}
	m.used -= b.Size()
	m.iss.EndRelease(b, true)
	return nil
}
