package example

import (
	"context"
	"os"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Options configure a Mechanism.
type Options struct {
	// Authority is the accounting scope the mechanism's memory is charged
	// to; "host" when empty.
	Authority memapi.AuthorityID
	// Capacity is the most bytes the mechanism holds at once (allocations,
	// committed granules and backings); a call that would hold more fails
	// with ErrOutOfMemory, and so does a reservation larger than it. 1 GiB
	// when zero.
	Capacity memapi.Bytes

	// The meta-tests of this package present the mechanism in other shapes,
	// honest or deliberately broken: under another name, offering fewer
	// capabilities, with other granularities.
	name             memapi.MechanismID // SpecName when empty
	offers           memapi.CapSet      // every capability when 0
	allocGranularity memapi.Bytes       // the page size when 0
	granularity      memapi.Bytes       // the page size when 0
}

// maxAlign is the largest alignment Allocate accepts.
const maxAlign = 1 << 30

// Mechanism is the example mechanism: ordinary Go memory behind every handle,
// every rule of the spec kept, one lock for everything. It is safe for
// concurrent use.
//
// Addresses are its own: each allocation and reservation gets a range of a
// private address space, aligned to the granularity and with a gap of a
// granule after it, so that a copy that overruns one fails instead of
// reaching its neighbour; the device context resolves an address to the
// bytes behind it.
type Mechanism struct {
	iss      *memapi.Issuer
	info     memapi.MechanismInfo
	offered  memapi.CapSet
	capacity memapi.Bytes

	mu    sync.Mutex
	used  memapi.Bytes
	next  memapi.DeviceAddr          // the first free address
	areas map[memapi.DeviceAddr]area // allocations and reservations by start address
}

// area is a range of the mechanism's address space: an allocation or a
// reservation.
type area interface {
	span() (memapi.DeviceAddr, memapi.Bytes)
}

// allocation is the memory behind one Allocate.
type allocation struct {
	addr memapi.DeviceAddr
	data []byte
}

func (a *allocation) span() (memapi.DeviceAddr, memapi.Bytes) {
	return a.addr, memapi.Bytes(len(a.data))
}

// New returns a mechanism with a fresh instance id.
func New(o Options) *Mechanism {
	page := memapi.Bytes(os.Getpagesize())
	if o.Authority == "" {
		o.Authority = "host"
	}
	if o.Capacity == 0 {
		o.Capacity = 1 << 30
	}
	if o.name == "" {
		o.name = SpecName
	}
	if o.offers == 0 {
		o.offers = memapi.Of(memapi.Capabilities...)
	}
	if o.allocGranularity == 0 {
		o.allocGranularity = page
	}
	if o.granularity == 0 {
		o.granularity = page
	}
	iss := memapi.NewIssuer()
	return &Mechanism{
		iss: iss,
		info: memapi.MechanismInfo{
			Mechanism:        o.name,
			Instance:         iss.Instance(),
			Device:           memapi.DeviceKey{Kind: memapi.DeviceKindHost},
			Authority:        o.Authority,
			AllocGranularity: o.allocGranularity,
			Granularity:      o.granularity,
		},
		offered:  o.offers,
		capacity: o.Capacity,
		next:     1 << 40,
		areas:    map[memapi.DeviceAddr]area{},
	}
}

// offers is the hook the generated accessors (AsVirtualBacking,
// AsSharedMapping) ask: whether this instance offers c.
func (m *Mechanism) offers(c memapi.Capability) bool { return m.offered.Has(c) }

// Info describes the instance; it never changes.
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// UsedBytes reports the bytes held: allocations, committed granules and
// backings.
func (m *Mechanism) UsedBytes() memapi.Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

// Allocate obtains req.Size bytes rounded up to the allocation granularity,
// zeroed, at an address aligned to req.Align (a power of two up to 1 GiB;
// the granularity when smaller). It fails with ErrNoGrant without a grant,
// ErrInvalidSize for a zero size or a bad alignment, and ErrOutOfMemory
// beyond Options.Capacity. It does not draw from the grant: the checked
// wrapper does, around the call.
func (m *Mechanism) Allocate(_ context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.errorf(op, memapi.ErrNoGrant, "a consuming call needs a grant")
	}
	size, err := m.size(op, req.Size, m.info.AllocGranularity)
	if err != nil {
		return nil, err
	}
	if req.Align&(req.Align-1) != 0 || req.Align > maxAlign {
		return nil, m.errorf(op, memapi.ErrInvalidSize, "alignment %d is not a power of two of at most 1 GiB", req.Align)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.hold(op, size); err != nil {
		return nil, err
	}
	a := &allocation{addr: m.place(size, req.Align), data: make([]byte, size)}
	m.areas[a.addr] = a
	return m.iss.NewAllocation(a.addr, size, a), nil
}

// Free returns the allocation's memory. Only the creating instance frees
// it, once: the Issuer's BeginRelease refuses a foreign, nil or released
// handle. It does not refund the account: the checked wrapper does.
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

// size validates a requested size and rounds it up to unit: a zero size or
// one whose rounding overflows is invalid, one beyond the capacity out of
// memory.
func (m *Mechanism) size(op string, n, unit memapi.Bytes) (memapi.Bytes, error) {
	if n == 0 {
		return 0, m.errorf(op, memapi.ErrInvalidSize, "zero size")
	}
	up, ok := memapi.RoundUp(n, unit)
	if !ok {
		return 0, m.errorf(op, memapi.ErrInvalidSize, "size %d overflows when rounded to %d", n, unit)
	}
	if up > m.capacity {
		e := m.errorf(op, memapi.ErrOutOfMemory, "size %d beyond the mechanism's capacity", up)
		e.Wanted, e.Available = up, m.capacity
		return 0, e
	}
	return up, nil
}

// hold counts n more bytes held, or fails with ErrOutOfMemory when the
// capacity has no room for them. The caller holds m.mu.
func (m *Mechanism) hold(op string, n memapi.Bytes) error {
	if n > m.capacity-m.used {
		e := m.errorf(op, memapi.ErrOutOfMemory, "the mechanism holds %d of its %d bytes", m.used, m.capacity)
		e.Wanted, e.Available = n, m.capacity-m.used
		return e
	}
	m.used += n
	return nil
}

// place assigns an address range aligned to the granularity (or to align
// when larger), with a gap of a granule after it so that neighbours never
// touch. The caller holds m.mu.
func (m *Mechanism) place(size, align memapi.Bytes) memapi.DeviceAddr {
	g := memapi.DeviceAddr(max(m.info.Granularity, align))
	addr := (m.next + g - 1) / g * g
	m.next = addr + memapi.DeviceAddr(size) + memapi.DeviceAddr(m.info.Granularity)
	return addr
}

// errorf returns a typed error naming the mechanism and its authority.
func (m *Mechanism) errorf(op string, kind error, format string, args ...any) *memapi.Error {
	e := memapi.Errorf(op, kind, format, args...)
	e.Mechanism, e.Authority = m.info.Mechanism, m.info.Authority
	return e
}
