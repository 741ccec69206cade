package conformancetest

import (
	"context"
	"fmt"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Config configures an in-memory Mechanism.
type Config struct {
	Name             memapi.MechanismID // Info().Mechanism; default "mem", which the spec does not declare
	Offers           memapi.CapSet      // 0: every capability
	AllocGranularity memapi.Bytes       // default 4096
	Granularity      memapi.Bytes       // default 65536
}

// limit is the largest size the in-memory mechanism hands out; beyond it the
// "device" refuses with ErrOutOfMemory, as a real one would.
const limit = memapi.Bytes(1) << 32

// Mechanism is a small, honest in-memory mechanism: ordinary Go memory behind
// every handle, every rule of the spec kept, one lock for everything. It is
// the correct baseline the meta-tests break on purpose.
type Mechanism struct {
	iss    *memapi.Issuer
	info   memapi.MechanismInfo
	offers memapi.CapSet

	mu    sync.Mutex
	used  memapi.Bytes
	next  memapi.DeviceAddr
	areas map[memapi.DeviceAddr]area // allocations and reservations by start address
}

// area is a range of the mechanism's address space.
type area interface {
	span() (memapi.DeviceAddr, memapi.Bytes)
}

type allocation struct {
	addr memapi.DeviceAddr
	data []byte
}

func (a *allocation) span() (memapi.DeviceAddr, memapi.Bytes) {
	return a.addr, memapi.Bytes(len(a.data))
}

// reservation has one slot per granule: empty, committed (data) or mapped (view).
type reservation struct {
	addr  memapi.DeviceAddr
	size  memapi.Bytes
	slots []slot
}

func (r *reservation) span() (memapi.DeviceAddr, memapi.Bytes) { return r.addr, r.size }

type slot struct {
	data []byte // committed granule
	view *view  // or mapped view
}

type backing struct {
	data  []byte
	views int
}

type view struct {
	b      *backing
	r      memapi.Range
	access memapi.Access
}

var _ memapi.Mechanism = (*Mechanism)(nil)
var _ memapi.VirtualBacking = (*Mechanism)(nil)
var _ memapi.SharedMapping = (*Mechanism)(nil)

// New returns an in-memory mechanism.
func New(cfg Config) *Mechanism {
	if cfg.Offers == 0 {
		cfg.Offers = memapi.Of(memapi.Capabilities...)
	}
	if cfg.AllocGranularity == 0 {
		cfg.AllocGranularity = 4096
	}
	if cfg.Granularity == 0 {
		cfg.Granularity = 65536
	}
	if cfg.Name == "" {
		cfg.Name = "mem"
	}
	iss := memapi.NewIssuer()
	return &Mechanism{
		iss: iss,
		info: memapi.MechanismInfo{
			Mechanism:        cfg.Name,
			Instance:         iss.Instance(),
			Device:           memapi.DeviceKey{Kind: memapi.DeviceKindHost},
			Authority:        "mem",
			AllocGranularity: cfg.AllocGranularity,
			Granularity:      cfg.Granularity,
		},
		offers: cfg.Offers,
		next:   memapi.DeviceAddr(1 << 40),
		areas:  map[memapi.DeviceAddr]area{},
	}
}

func (m *Mechanism) errorf(op string, kind error, format string, args ...any) *memapi.Error {
	e := memapi.Errorf(op, kind, format, args...)
	e.Mechanism, e.Authority = m.info.Mechanism, m.info.Authority
	return e
}

// size validates and rounds a requested size.
func (m *Mechanism) size(op string, n, unit memapi.Bytes) (memapi.Bytes, error) {
	if n == 0 {
		return 0, m.errorf(op, memapi.ErrInvalidSize, "zero size")
	}
	up, ok := memapi.RoundUp(n, unit)
	if !ok {
		return 0, m.errorf(op, memapi.ErrInvalidSize, "size %d overflows when rounded to %d", n, unit)
	}
	if up > limit {
		e := m.errorf(op, memapi.ErrOutOfMemory, "size %d beyond the in-memory limit", up)
		e.Wanted, e.Available = up, limit
		return 0, e
	}
	return up, nil
}

// place assigns an address range, aligned to the granularity, with a gap
// after it so that neighbours never touch.
func (m *Mechanism) place(size memapi.Bytes) memapi.DeviceAddr {
	g := memapi.DeviceAddr(m.info.Granularity)
	addr := (m.next + g - 1) / g * g
	m.next = addr + memapi.DeviceAddr(size) + g
	return addr
}

func (m *Mechanism) has(c memapi.Capability) bool { return m.offers.Has(c) }

// Info describes the instance.
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// UsedBytes reports allocations, committed granules and backings.
func (m *Mechanism) UsedBytes() memapi.Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

// AsVirtualBacking returns the capability when the instance offers it.
func (m *Mechanism) AsVirtualBacking() (memapi.VirtualBacking, bool) {
	if !m.has(memapi.CapVirtualBacking) {
		return nil, false
	}
	return m, true
}

// AsSharedMapping returns the capability when the instance offers it.
func (m *Mechanism) AsSharedMapping() (memapi.SharedMapping, bool) {
	if !m.has(memapi.CapSharedMapping) {
		return nil, false
	}
	return m, true
}

// Allocate obtains req.Size bytes rounded up to the allocation granularity.
func (m *Mechanism) Allocate(_ context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.errorf(op, memapi.ErrNoGrant, "no grant")
	}
	size, err := m.size(op, req.Size, m.info.AllocGranularity)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := &allocation{addr: m.place(size), data: make([]byte, size)}
	m.areas[a.addr] = a
	m.used += size
	return m.iss.NewAllocation(a.addr, size, a), nil
}

// Free returns the allocation's memory.
func (m *Mechanism) Free(_ context.Context, a *memapi.Allocation, _ memapi.Account) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.BeginRelease("DeviceAllocator.Free", a)
	if err != nil {
		return err
	}
	al := impl.(*allocation)
	delete(m.areas, al.addr)
	m.used -= memapi.Bytes(len(al.data))
	m.iss.EndRelease(a, true)
	return nil
}

// Reserve obtains address space rounded up to the granularity.
func (m *Mechanism) Reserve(_ context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	size, err := m.size("VirtualBacking.Reserve", req.Size, m.info.Granularity)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := &reservation{addr: m.place(size), size: size, slots: make([]slot, size/m.info.Granularity)}
	m.areas[r.addr] = r
	return m.iss.NewReservation(r.addr, size, r), nil
}

// slotsOf validates r against res and returns the reservation and the slot
// indexes r covers.
func (m *Mechanism) slotsOf(op string, res *memapi.Reservation, r memapi.Range) (*reservation, int, int, error) {
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

// Commit installs zeroed backing for r.
func (m *Mechanism) Commit(_ context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return m.errorf(op, memapi.ErrNoGrant, "no grant")
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
	for i := from; i < to; i++ {
		rs.slots[i].data = make([]byte, m.info.Granularity)
	}
	m.used += r.Len
	return nil
}

// Decommit removes the backing of r.
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

// ReleaseReservation decommits what is left and frees the range.
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

// CreateBacking obtains zeroed physical memory rounded up to the granularity.
func (m *Mechanism) CreateBacking(_ context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, m.errorf(op, memapi.ErrNoGrant, "no grant")
	}
	n, err := m.size(op, size, m.info.Granularity)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used += n
	return m.iss.NewBacking(n, &backing{data: make([]byte, n)}), nil
}

// MapView maps all of b at r of res.
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

// clearView empties the slots of a view and drops its backing's count.
func (m *Mechanism) clearView(v *memapi.View, vs *view) {
	rs := m.areas[v.Reservation().Addr()].(*reservation)
	g := m.info.Granularity
	for i := int(vs.r.Off / g); i < int((vs.r.Off+vs.r.Len)/g); i++ {
		rs.slots[i].view = nil
	}
	vs.b.views--
}

// CopyOnWrite replaces v by a read-write view of a private copy.
func (m *Mechanism) CopyOnWrite(_ context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, m.errorf(op, memapi.ErrNoGrant, "no grant")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	impl, err := m.iss.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	vs := impl.(*view)
	m.clearView(v, vs)
	nb := &backing{data: append([]byte(nil), vs.b.data...)}
	b := m.iss.NewBacking(memapi.Bytes(len(nb.data)), nb)
	m.used += b.Size()
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

// ReleaseBacking frees b once no view maps it.
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

// segments resolves [addr, addr+n) to the memory behind it, for a copy. A
// write into a read-only view fails with ErrReadOnly, an address with no
// backing with ErrNotCommitted (inside a reservation) or ErrInvalidRange.
// Nothing is copied unless every part resolves.
func (m *Mechanism) segments(op string, addr memapi.DeviceAddr, n memapi.Bytes, write bool) ([][]byte, error) {
	if n == 0 {
		return nil, nil
	}
	for _, ar := range m.areas {
		start, size := ar.span()
		if addr < start || uint64(addr-start) >= uint64(size) {
			continue
		}
		off := memapi.Bytes(addr - start)
		if off+n > size || off+n < off {
			return nil, m.errorf(op, memapi.ErrInvalidRange, "[%#x, +%d) runs past the end of its area", addr, n)
		}
		switch ar := ar.(type) {
		case *allocation:
			return [][]byte{ar.data[off : off+n]}, nil
		case *reservation:
			g := m.info.Granularity
			var out [][]byte
			for n > 0 {
				i, in := off/g, off%g
				k := min(n, g-in)
				s := ar.slots[i]
				switch {
				case s.data != nil:
					out = append(out, s.data[in:in+k])
				case s.view != nil:
					if write && s.view.access != memapi.AccessReadWrite {
						return nil, m.errorf(op, memapi.ErrReadOnly, "write into a read-only view at %#x", addr)
					}
					vo := off - s.view.r.Off
					out = append(out, s.view.b.data[vo:vo+k])
				default:
					return nil, m.errorf(op, memapi.ErrNotCommitted, "no backing at %#x", start+memapi.DeviceAddr(off))
				}
				off, n = off+k, n-k
			}
			return out, nil
		}
	}
	return nil, m.errorf(op, memapi.ErrInvalidRange, "no memory at %#x", addr)
}

// copyIn writes src at dst.
func (m *Mechanism) copyIn(dst memapi.DeviceAddr, src []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	segs, err := m.segments("Stream.CopyToDevice", dst, memapi.Bytes(len(src)), true)
	if err != nil {
		return err
	}
	for _, s := range segs {
		src = src[copy(s, src):]
	}
	return nil
}

// copyOut reads len(dst) bytes at src.
func (m *Mechanism) copyOut(dst []byte, src memapi.DeviceAddr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	segs, err := m.segments("Stream.CopyFromDevice", src, memapi.Bytes(len(dst)), false)
	if err != nil {
		return err
	}
	for _, s := range segs {
		dst = dst[copy(dst, s):]
	}
	return nil
}

func (m *Mechanism) String() string { return fmt.Sprintf("mem#%d", m.info.Instance) }
