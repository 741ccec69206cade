package example

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
)

// VirtualBacking: a reservation is a range of the private address space with
// one slot per granule, which Commit fills with fresh zeroed bytes and
// Decommit empties (SharedMapping's MapView fills slots with a view instead).

// reservation is the state behind one Reserve.
type reservation struct {
	addr  memapi.DeviceAddr
	size  memapi.Bytes
	slots []slot
}

func (r *reservation) span() (memapi.DeviceAddr, memapi.Bytes) { return r.addr, r.size }

// slot is one granule of a reservation: empty, committed (data) or mapped
// (view).
type slot struct {
	data []byte // committed granule
	view *view  // or mapped view
}

// Reserve obtains address space rounded up to the granularity, with nothing
// behind it yet. It holds no memory, so it draws from no grant.
func (m *Mechanism) Reserve(_ context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	size, err := m.size("VirtualBacking.Reserve", req.Size, m.info.Granularity)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := &reservation{addr: m.place(size, 0), size: size, slots: make([]slot, size/m.info.Granularity)}
	m.areas[r.addr] = r
	return m.iss.NewReservation(r.addr, size, r), nil
}

// slotsOf validates r against res and returns the reservation and the slot
// indexes [from, to) r covers. The caller holds m.mu.
func (m *Mechanism) slotsOf(op string, res *memapi.Reservation, r memapi.Range) (rs *reservation, from, to int, err error) {
	impl, err := m.iss.Impl(op, res)
	if err != nil {
		return nil, 0, 0, err
	}
	if !r.Within(res.Size()) {
		return nil, 0, 0, m.errorf(op, memapi.ErrInvalidRange, "%v not within a reservation of %d bytes", r, res.Size())
	}
	g := m.info.Granularity
	if !r.Aligned(g) {
		return nil, 0, 0, m.errorf(op, memapi.ErrUnaligned, "%v not aligned to %d", r, g)
	}
	return impl.(*reservation), int(r.Off / g), int((r.Off + r.Len) / g), nil
}

// Commit installs zeroed backing for r, every granule of which must be empty:
// a Commit that fails changes nothing.
func (m *Mechanism) Commit(_ context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return m.errorf(op, memapi.ErrNoGrant, "a consuming call needs a grant")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rs, from, to, err := m.slotsOf(op, res, r)
	if err != nil {
		return err
	}
	for i := from; i < to; i++ {
		if rs.slots[i].data != nil || rs.slots[i].view != nil {
			return m.errorf(op, memapi.ErrCommitted, "granule %d of %v already has backing", i, res)
		}
	}
	if err := m.hold(op, r.Len); err != nil {
		return err
	}
	for i := from; i < to; i++ {
		rs.slots[i].data = make([]byte, m.info.Granularity)
	}
	return nil
}

// Decommit removes the backing of r, every granule of which must be
// committed.
func (m *Mechanism) Decommit(_ context.Context, res *memapi.Reservation, r memapi.Range, _ memapi.Account) error {
	const op = "VirtualBacking.Decommit"
	m.mu.Lock()
	defer m.mu.Unlock()
	rs, from, to, err := m.slotsOf(op, res, r)
	if err != nil {
		return err
	}
	for i := from; i < to; i++ {
		if rs.slots[i].data == nil {
			return m.errorf(op, memapi.ErrNotCommitted, "granule %d of %v is not committed", i, res)
		}
	}
	for i := from; i < to; i++ {
		rs.slots[i].data = nil
	}
	m.used -= r.Len
	return nil
}

// committed counts the committed bytes of rs. The caller holds m.mu.
func (m *Mechanism) committed(rs *reservation) memapi.Bytes {
	var n memapi.Bytes
	for _, s := range rs.slots {
		if s.data != nil {
			n += m.info.Granularity
		}
	}
	return n
}

// CommittedBytes reports the committed bytes of res.
func (m *Mechanism) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.Impl("VirtualBacking.CommittedBytes", res)
	if err != nil {
		return 0, err
	}
	return m.committed(impl.(*reservation)), nil
}

// ReleaseReservation decommits what is left and frees the range. It fails
// with ErrInUse, and keeps the reservation, while a view is mapped in it.
func (m *Mechanism) ReleaseReservation(_ context.Context, res *memapi.Reservation, _ memapi.Account) error {
	const op = "VirtualBacking.ReleaseReservation"
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.BeginRelease(op, res)
	if err != nil {
		return err
	}
	rs := impl.(*reservation)
	for i, s := range rs.slots {
		if s.view != nil {
			m.iss.EndRelease(res, false)
			return m.errorf(op, memapi.ErrInUse, "a view is mapped at granule %d", i)
		}
	}
	m.used -= m.committed(rs)
	delete(m.areas, rs.addr)
	m.iss.EndRelease(res, true)
	return nil
}
