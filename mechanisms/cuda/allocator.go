package cuda

import (
	"context"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// allocState is the private state of an Allocation: one cuMemAlloc block of
// exactly the rounded size.
type allocState struct {
	h    *memapi.Allocation
	addr uint64
	size uint64
}

// driverAlign is the alignment cuMemAlloc guarantees.
const driverAlign = 256

// Allocate obtains req.Size bytes rounded up to Info().AllocGranularity with
// cuMemAlloc_v2, asking the driver for the rounded size, so UsedBytes is
// exactly what the driver was asked for. req.Align must be 0 or a power of
// two of at most 256 bytes, the alignment cuMemAlloc guarantees
// (ErrInvalidSize otherwise): a larger one would hold only by chance.
func (m *Mechanism) Allocate(ctx context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, nil, "a consuming call needs a grant")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	ag := uint64(m.info.AllocGranularity)
	if req.Size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "zero size")
	}
	if req.Align != 0 && (req.Align&(req.Align-1) != 0 || req.Align > driverAlign) {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "alignment %d is not a power of two of at most the %d bytes cuMemAlloc guarantees", req.Align, driverAlign)
	}
	size, ok := roundUp(uint64(req.Size), ag)
	if !ok {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "size %d overflows when rounded to %d", req.Size, ag)
	}
	if err := m.beyondDevice(op, size); err != nil {
		return nil, err
	}
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var ptr driver.DevicePtr
	err := m.dev.do(func(t *driver.Table) error {
		if err := check(t, "cuMemAlloc_v2", t.MemAlloc(&ptr, size)); err != nil {
			return err
		}
		if a := max(uint64(req.Align), driverAlign); uint64(ptr)%a != 0 {
			_ = t.MemFree(ptr)
			return m.fail(op, memapi.ErrUnaligned, nil, "driver returned %#x, not aligned to %d", uint64(ptr), a)
		}
		return nil
	})
	if err != nil {
		if e, ok := err.(*memapi.Error); ok && e.Kind == memapi.ErrUnaligned {
			return nil, e
		}
		return nil, m.driverErr(op, err, size)
	}
	as := &allocState{addr: uint64(ptr), size: size}
	as.h = m.issuer.NewAllocation(memapi.DeviceAddr(ptr), memapi.Bytes(size), as)
	m.allocs[as] = struct{}{}
	m.regions.insert(region{start: as.addr, end: as.addr + size, alloc: as})
	m.used.Add(size)
	return as.h, nil
}

// Free returns the allocation's memory with cuMemFree_v2. The account is the
// checked wrapper's business: the bare mechanism ignores it.
func (m *Mechanism) Free(ctx context.Context, a *memapi.Allocation, _ memapi.Account) error {
	const op = "DeviceAllocator.Free"
	impl, err := m.issuer.BeginRelease(op, a)
	if err != nil {
		return err
	}
	ok := false
	defer func() { m.issuer.EndRelease(a, ok) }()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	as := impl.(*allocState)
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := m.dev.do(func(t *driver.Table) error {
		return check(t, "cuMemFree_v2", t.MemFree(driver.DevicePtr(as.addr)))
	}); err != nil {
		return m.driverErr(op, err, 0)
	}
	delete(m.allocs, as)
	m.regions.remove(as.addr)
	m.used.Add(^(as.size - 1))
	ok = true
	return nil
}
