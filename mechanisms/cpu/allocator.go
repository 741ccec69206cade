package cpu

import (
	"context"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// allocation is the private state of an Allocation: its own anonymous
// mapping.
type allocation struct {
	ptr  unsafe.Pointer
	size uintptr
}

// Allocate maps req.Size bytes (rounded up to the page size) of private
// anonymous memory, aligned to req.Align when that is above the page size
// (and, with a 2 MiB granularity, allocations of 2 MiB or more
// to 2 MiB with MADV_HUGEPAGE), and populates it so that the pages are really charged now:
// an out-of-memory is ErrOutOfMemory here, never a fault at first touch. The
// memory reads as zeros. req.Align must be 0 or a power of two of at most
// 1 GiB, whatever its size (ErrInvalidSize otherwise). The grant is not drawn
// from (the checked wrapper does that) but must be present.
func (m *Mechanism) Allocate(ctx context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	size, err := m.checkSize(op, req.Size, memapi.Bytes(pageSize))
	if err != nil {
		return nil, err
	}
	if req.Align&(req.Align-1) != 0 || req.Align > maxGranularity {
		return nil, m.fail(op, memapi.ErrInvalidSize, 0, req.Align, maxGranularity, "alignment %d is not a power of two of at most 1 GiB", req.Align)
	}
	align := uintptr(pageSize)
	if req.Align > memapi.Bytes(pageSize) {
		align = uintptr(req.Align)
	}
	// A large allocation of a huge-page mechanism is aligned to 2 MiB and
	// advised MADV_HUGEPAGE before it is populated: one fault and one
	// zeroing per 2 MiB instead of 512.
	huge := m.huge && size >= Granularity2MiB
	if huge {
		align = max(align, uintptr(Granularity2MiB))
	}
	p, err := m.mapAligned(op, uintptr(size), align, unix.PROT_READ|unix.PROT_WRITE, 0)
	if err != nil {
		return nil, m.errno(op, memapi.ErrOutOfMemory, err, "mmap")
	}
	if huge {
		m.adviseHuge(p, uintptr(size))
	}
	err = m.fault(op, "madvise", uintptr(size))
	if err == nil {
		err = populate(p, uintptr(size))
	}
	if err != nil {
		_ = munmap(p, uintptr(size))
		e := m.errno(op, memapi.ErrOutOfMemory, err, "populate").(*memapi.Error)
		e.Wanted = size
		return nil, e
	}
	st := &allocation{ptr: p, size: uintptr(size)}
	base := uint64(uintptr(p))
	a := m.issuer.NewAllocation(memapi.DeviceAddr(base), size, st)
	m.mu.Lock()
	m.insertRegion(&region{base: base, size: uint64(size), ptr: p, alloc: st})
	m.allocBytes.Add(uint64(size))
	m.mu.Unlock()
	return a, nil
}

// Free unmaps the allocation. Only the creating instance frees it; a second
// Free fails with ErrReleased. The account is not refunded (the checked
// wrapper does that).
func (m *Mechanism) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	const op = "DeviceAllocator.Free"
	impl, err := m.issuer.BeginRelease(op, a)
	if err != nil {
		return err
	}
	st := impl.(*allocation)
	base := uint64(uintptr(st.ptr))
	m.mu.Lock()
	defer m.mu.Unlock()
	err = m.fault(op, "munmap", st.size)
	if err == nil {
		err = munmap(st.ptr, st.size)
	}
	if err != nil {
		m.issuer.EndRelease(a, false)
		return m.errno(op, memapi.ErrInvalidRange, err, "munmap")
	}
	m.removeRegion(base)
	m.allocBytes.Add(-uint64(st.size))
	m.issuer.EndRelease(a, true)
	return nil
}

// mapAligned maps n bytes with prot whose start is a multiple of align (a
// power of two, at least the page size): it maps n+align-page bytes and
// unmaps the head and tail around the aligned part. Trimming happens
// before anything else can map next to the new range, and never inside a
// range the mechanism owns. op is the contract operation, for the fault
// injector.
func (m *Mechanism) mapAligned(op string, n, align uintptr, prot, flags int) (unsafe.Pointer, error) {
	if align <= uintptr(pageSize) {
		if err := m.fault(op, "mmap", n); err != nil {
			return nil, err
		}
		return mmapAnon(n, prot, flags)
	}
	total := n + align - uintptr(pageSize)
	if total < n {
		return nil, unix.ENOMEM
	}
	if err := m.fault(op, "mmap", total); err != nil {
		return nil, err
	}
	p, err := mmapAnon(total, prot, flags)
	if err != nil {
		return nil, err
	}
	addr := uintptr(p)
	head := (align - addr%align) % align
	if head > 0 {
		err := m.fault(op, "munmap", head)
		if err == nil {
			err = munmap(p, head)
		}
		if err != nil {
			_ = munmap(p, total)
			return nil, err
		}
	}
	q := unsafe.Add(p, head)
	if tail := total - head - n; tail > 0 {
		err := m.fault(op, "munmap", tail)
		if err == nil {
			err = munmap(unsafe.Add(q, n), tail)
		}
		if err != nil {
			_ = munmap(q, total-head)
			return nil, err
		}
	}
	return q, nil
}
