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
	// Capacity is the most bytes the mechanism holds at once; Allocate
	// fails with ErrOutOfMemory beyond it. 1 GiB when zero.
	Capacity memapi.Bytes
}

// maxAlign is the largest alignment Allocate accepts.
const maxAlign = 1 << 30

// base is the first address of the private address space.
const base = 1 << 32

// Mechanism is the example mechanism. It is safe for concurrent use.
type Mechanism struct {
	issuer   *memapi.Issuer
	info     memapi.MechanismInfo
	capacity memapi.Bytes
	page     memapi.Bytes

	mu   sync.RWMutex
	next memapi.DeviceAddr // the first free address
	live map[memapi.DeviceAddr]*block
	used memapi.Bytes
}

// block is the memory behind one allocation.
type block struct {
	addr memapi.DeviceAddr
	data []byte
}

// New returns a mechanism with a fresh instance id.
func New(o Options) *Mechanism {
	if o.Authority == "" {
		o.Authority = "host"
	}
	if o.Capacity == 0 {
		o.Capacity = 1 << 30
	}
	iss := memapi.NewIssuer()
	page := memapi.Bytes(os.Getpagesize())
	return &Mechanism{
		issuer: iss,
		info: memapi.MechanismInfo{
			Mechanism:        SpecName,
			Instance:         iss.Instance(),
			Device:           memapi.DeviceKey{Kind: memapi.DeviceKindHost},
			Authority:        o.Authority,
			AllocGranularity: page,
			Granularity:      page,
		},
		capacity: o.Capacity,
		page:     page,
		next:     base,
		live:     map[memapi.DeviceAddr]*block{},
	}
}

// Info describes the instance; it never changes.
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// Allocate obtains req.Size bytes rounded up to the page size, zeroed, at an
// address aligned to req.Align (a power of two up to 1 GiB; the page size
// when smaller). It fails with ErrNoGrant without a grant, ErrInvalidSize
// for a zero or absurd size or a bad alignment, and ErrOutOfMemory beyond
// Options.Capacity. It does not draw from the grant: the checked wrapper
// does.
func (m *Mechanism) Allocate(ctx context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, "a consuming call needs a grant")
	}
	if req.Size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, "zero size")
	}
	size, ok := memapi.RoundUp(req.Size, m.page)
	if !ok || size > maxAlign*1024 {
		return nil, m.fail(op, memapi.ErrInvalidSize, "%d bytes is more than any host has", req.Size)
	}
	align := m.page
	if req.Align > align {
		if req.Align&(req.Align-1) != 0 || req.Align > maxAlign {
			return nil, m.fail(op, memapi.ErrInvalidSize, "alignment %d is not a power of two of at most 1 GiB", req.Align)
		}
		align = req.Align
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used+size > m.capacity {
		e := m.fail(op, memapi.ErrOutOfMemory, "the mechanism holds %d of its %d bytes", m.used, m.capacity)
		e.Wanted, e.Available = size, m.capacity-m.used
		return nil, e
	}
	addr, _ := memapi.RoundUp(memapi.Bytes(m.next), align)
	b := &block{addr: memapi.DeviceAddr(addr), data: make([]byte, size)}
	m.next = b.addr + memapi.DeviceAddr(size+m.page) // one unmapped page after it
	m.live[b.addr] = b
	m.used += size
	return m.issuer.NewAllocation(b.addr, size, b), nil
}

// Free returns the allocation's memory. Only the creating instance frees
// it; a second Free fails with ErrReleased. It does not refund the account:
// the checked wrapper does.
func (m *Mechanism) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	impl, err := m.issuer.BeginRelease("DeviceAllocator.Free", a)
	if err != nil {
		return err
	}
	b := impl.(*block)
	m.mu.Lock()
	delete(m.live, b.addr)
	m.used -= memapi.Bytes(len(b.data))
	m.mu.Unlock()
	m.issuer.EndRelease(a, true)
	return nil
}

// UsedBytes reports the bytes the live allocations hold.
func (m *Mechanism) UsedBytes() memapi.Bytes {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.used
}

// bytesAt returns the n bytes at addr, which must lie inside one live
// allocation. The caller holds m.mu.
func (m *Mechanism) bytesAt(op string, addr memapi.DeviceAddr, n memapi.Bytes) ([]byte, error) {
	for _, b := range m.live {
		if addr >= b.addr && addr < b.addr+memapi.DeviceAddr(len(b.data)) {
			off := memapi.Bytes(addr - b.addr)
			if n > memapi.Bytes(len(b.data))-off {
				return nil, m.fail(op, memapi.ErrInvalidRange, "%d bytes at %#x run past the allocation at %#x", n, addr, b.addr)
			}
			return b.data[off : off+n], nil
		}
	}
	return nil, m.fail(op, memapi.ErrInvalidRange, "no live allocation at %#x", addr)
}

func (m *Mechanism) fail(op string, kind error, format string, args ...any) *memapi.Error {
	e := memapi.Errorf(op, kind, format, args...)
	e.Mechanism = m.info.Mechanism
	e.Authority = m.info.Authority
	return e
}
