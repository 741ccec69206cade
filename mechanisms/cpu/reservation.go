package cpu

import (
	"context"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// reservation is the private state of a Reservation: a PROT_NONE,
// MAP_NORESERVE mapping aligned to the granularity, and what backs which
// part of it. Guarded by Mechanism.mu.
type reservation struct {
	ptr       unsafe.Pointer
	size      memapi.Bytes
	backed    extents
	committed memapi.Bytes // bytes of extCommitted extents
	views     int
	inflight  int // Commits populating outside the lock (extCommitting extents)
}

// Reserve maps req.Size bytes (rounded up to the granularity) of address
// space with PROT_NONE and MAP_NORESERVE: nothing is charged and nothing can
// be touched until Commit. The base is aligned to the granularity; with a
// 2 MiB granularity the range is advised MADV_HUGEPAGE so that each committed
// chunk can be one transparent huge page.
func (m *Mechanism) Reserve(ctx context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	const op = "VirtualBacking.Reserve"
	size, err := m.checkSize(op, req.Size, memapi.Bytes(m.gran))
	if err != nil {
		return nil, err
	}
	p, err := m.mapAligned(op, uintptr(size), m.gran, unix.PROT_NONE, unix.MAP_NORESERVE)
	if err != nil {
		e := m.errno(op, memapi.ErrOutOfMemory, err, "no address space for the reservation").(*memapi.Error)
		e.Wanted = size
		return nil, e
	}
	m.adviseHuge(p, uintptr(size))
	st := &reservation{ptr: p, size: size}
	base := uint64(uintptr(p))
	res := m.issuer.NewReservation(memapi.DeviceAddr(base), size, st)
	m.mu.Lock()
	m.insertRegion(&region{base: base, size: uint64(size), ptr: p, res: st})
	m.mu.Unlock()
	return res, nil
}

// adviseHuge gives MADV_HUGEPAGE to reserved space when the granularity
// allows whole huge pages. It is advice: a kernel without THP refuses it and
// the mechanism works the same with small pages.
func (m *Mechanism) adviseHuge(p unsafe.Pointer, n uintptr) {
	if m.huge {
		_ = madvise(p, n, unix.MADV_HUGEPAGE)
	}
}

// reservationOf returns the state of a live reservation of this instance.
func (m *Mechanism) reservationOf(op string, res *memapi.Reservation) (*reservation, error) {
	impl, err := m.issuer.Impl(op, res)
	if err != nil {
		return nil, err
	}
	return impl.(*reservation), nil
}

// Commit makes r read-write and populates it (MADV_POPULATE_WRITE), so the
// kernel charges the pages now. If the kernel refuses (ENOMEM at mprotect
// under RLIMIT_DATA or at vm.max_map_count, ENOMEM or EFAULT at populate
// under a memory limit) the range goes back to PROT_NONE with no pages and
// Commit returns ErrOutOfMemory (with a *MapCountError cause when the
// process ran out of mappings). Fresh pages read as zeros, also where an
// earlier commit held data (Decommit dropped those pages).
//
// The exclusive lock is held only to claim the range (a committing extent,
// which no other Commit, view or copy may use) and to settle it: mprotect
// and populate run outside it, so commits of disjoint ranges fault their
// pages in parallel and copies to other memory do not wait for them.
// ReleaseReservation waits for a reservation's commits in flight.
func (m *Mechanism) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return m.noGrant(op)
	}
	st, err := m.reservationOf(op, res)
	if err != nil {
		return err
	}
	if err := m.checkRange(op, r, res); err != nil {
		return err
	}
	m.mu.Lock()
	if err := m.issuer.Check(op, res); err != nil { // released while we waited
		m.mu.Unlock()
		return err
	}
	if !st.backed.free(r.Off, r.Off+r.Len) {
		m.mu.Unlock()
		return m.fail(op, memapi.ErrCommitted, res.ID(), r.Len, 0, "part of %v is already committed or mapped", r)
	}
	st.backed = st.backed.insert(extent{off: r.Off, end: r.Off + r.Len, kind: extCommitting})
	st.inflight++
	m.mu.Unlock()

	err = m.install(op, res, st, r)

	m.mu.Lock()
	defer m.mu.Unlock()
	st.backed = st.backed.settle(r.Off, err == nil)
	st.inflight--
	if st.inflight == 0 {
		m.settled.Broadcast()
	}
	if err != nil {
		return err
	}
	st.committed += r.Len
	m.committedBytes.Add(uint64(r.Len))
	return nil
}

// install makes the claimed range r of st read-write and populates it, or
// leaves it PROT_NONE with no pages and returns why not. It runs without
// m.mu: the committing extent keeps everyone else off the range.
func (m *Mechanism) install(op string, res *memapi.Reservation, st *reservation, r memapi.Range) error {
	p, n := unsafe.Add(st.ptr, r.Off), uintptr(r.Len)
	err := m.fault(op, "mprotect", n)
	if err == nil {
		err = mprotect(p, n, unix.PROT_READ|unix.PROT_WRITE)
	}
	if err != nil {
		e := m.errno(op, memapi.ErrOutOfMemory, err, "mprotect read-write").(*memapi.Error)
		e.Handle, e.Wanted = res.ID(), r.Len
		mapCountCause(e, err)
		return e
	}
	err = m.fault(op, "madvise", n)
	if err == nil {
		err = m.populate(p, n)
	}
	if err != nil {
		// Give back whatever was faulted in before the refusal.
		_ = madvise(p, n, unix.MADV_DONTNEED)
		_ = mprotect(p, n, unix.PROT_NONE)
		e := m.errno(op, memapi.ErrOutOfMemory, err, "populate").(*memapi.Error)
		e.Handle, e.Wanted = res.ID(), r.Len
		return e
	}
	return nil
}

// Decommit makes r PROT_NONE again and drops its pages (MADV_DONTNEED), so
// the kernel frees them and a later Commit reads zeros. r must be fully
// committed (ErrNotCommitted otherwise; a view is not committed memory).
func (m *Mechanism) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, to memapi.Account) error {
	const op = "VirtualBacking.Decommit"
	st, err := m.reservationOf(op, res)
	if err != nil {
		return err
	}
	if err := m.checkRange(op, r, res); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.issuer.Check(op, res); err != nil {
		return err
	}
	if !st.backed.committed(r.Off, r.Off+r.Len) {
		return m.fail(op, memapi.ErrNotCommitted, res.ID(), r.Len, 0, "part of %v is not committed", r)
	}
	p, n := unsafe.Add(st.ptr, r.Off), uintptr(r.Len)
	// PROT_NONE first: if it fails nothing changed. Dropping the pages of a
	// PROT_NONE private mapping works; if it fails, restore access.
	err = m.fault(op, "mprotect", n)
	if err == nil {
		err = mprotect(p, n, unix.PROT_NONE)
	}
	if err != nil {
		return m.errno(op, memapi.ErrInvalidRange, err, "mprotect none")
	}
	err = m.fault(op, "madvise", n)
	if err == nil {
		err = madvise(p, n, unix.MADV_DONTNEED)
	}
	if err != nil {
		_ = mprotect(p, n, unix.PROT_READ|unix.PROT_WRITE)
		return m.errno(op, memapi.ErrInvalidRange, err, "madvise dontneed")
	}
	st.backed = st.backed.cut(r.Off, r.Off+r.Len)
	st.committed -= r.Len
	m.committedBytes.Add(-uint64(r.Len))
	return nil
}

// CommittedBytes reports the bytes of res installed by Commit (views are not
// counted: their backing is counted once, by the backing).
func (m *Mechanism) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	st, err := m.reservationOf("VirtualBacking.CommittedBytes", res)
	if err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return st.committed, nil
}

// ReleaseReservation unmaps the whole reservation, which frees its committed
// pages. It fails with ErrInUse, changing nothing, while views are mapped in
// it: unmap them first.
func (m *Mechanism) ReleaseReservation(ctx context.Context, res *memapi.Reservation, to memapi.Account) error {
	const op = "VirtualBacking.ReleaseReservation"
	impl, err := m.issuer.BeginRelease(op, res)
	if err != nil {
		return err
	}
	st := impl.(*reservation)
	m.mu.Lock()
	defer m.mu.Unlock()
	for st.inflight > 0 { // a Commit is populating part of it: it ends soon
		m.settled.Wait()
	}
	if st.views > 0 {
		m.issuer.EndRelease(res, false)
		return m.fail(op, memapi.ErrInUse, res.ID(), 0, 0, "%d views are still mapped in the reservation", st.views)
	}
	err = m.fault(op, "munmap", uintptr(st.size))
	if err == nil {
		err = munmap(st.ptr, uintptr(st.size))
	}
	if err != nil {
		m.issuer.EndRelease(res, false)
		return m.errno(op, memapi.ErrInvalidRange, err, "munmap")
	}
	m.removeRegion(uint64(uintptr(st.ptr)))
	m.committedBytes.Add(-uint64(st.committed))
	st.committed, st.backed = 0, nil
	m.issuer.EndRelease(res, true)
	return nil
}
