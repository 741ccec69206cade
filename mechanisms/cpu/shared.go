package cpu

import (
	"context"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// backing is the private state of a Backing: a memfd whose pages were
// allocated up front, and how many views map it. Guarded by Mechanism.mu.
type backing struct {
	fd    int
	size  memapi.Bytes
	views int
}

// view is the private state of a View: where it maps which backing.
type view struct {
	res    *reservation
	b      *backing
	off, n memapi.Bytes
	access memapi.Access
}

// CreateBacking makes a memfd of size bytes (rounded up to the granularity)
// and allocates all its pages with fallocate, so the backing is charged when
// it is created (ErrOutOfMemory when the kernel refuses, with nothing left
// behind) and the file's allocated blocks equal Backing.Size. The pages read
// as zeros. The backing is mapped nowhere until MapView.
func (m *Mechanism) CreateBacking(ctx context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	n, err := m.checkSize(op, size, memapi.Bytes(m.gran))
	if err != nil {
		return nil, err
	}
	fd, err := m.newMemfd(op, n)
	if err != nil {
		e := m.errno(op, memapi.ErrOutOfMemory, err, "memfd").(*memapi.Error)
		e.Wanted = n
		return nil, e
	}
	err = m.fault(op, "fallocate", uintptr(n))
	if err == nil {
		err = fallocate(fd, 0, 0, int64(n))
	}
	if err != nil {
		_ = unix.Close(fd)
		e := m.errno(op, memapi.ErrOutOfMemory, err, "fallocate").(*memapi.Error)
		e.Wanted = n
		return nil, e
	}
	return m.addBacking(fd, n), nil
}

// newMemfd returns a close-on-exec memfd of n bytes with no pages yet, for
// the contract operation op.
func (m *Mechanism) newMemfd(op string, n memapi.Bytes) (int, error) {
	if err := m.fault(op, "memfd_create", uintptr(n)); err != nil {
		return -1, err
	}
	fd, err := unix.MemfdCreate("memgen-cpu", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	err = m.fault(op, "ftruncate", uintptr(n))
	if err == nil {
		err = unix.Ftruncate(fd, int64(n))
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// addBacking registers a populated memfd and returns its handle.
func (m *Mechanism) addBacking(fd int, n memapi.Bytes) *memapi.Backing {
	st := &backing{fd: fd, size: n}
	m.mu.Lock()
	m.backings[st] = struct{}{}
	m.backingBytes.Add(uint64(n))
	m.mu.Unlock()
	return m.issuer.NewBacking(n, st)
}

func protOf(a memapi.Access) int {
	if a == memapi.AccessReadWrite {
		return unix.PROT_READ | unix.PROT_WRITE
	}
	return unix.PROT_READ
}

// MapView maps the whole of b at r of res with mmap(MAP_SHARED|MAP_FIXED),
// PROT_READ for a read-only view (a host write faults with SIGSEGV) and
// PROT_READ|PROT_WRITE for a read-write one. r must be aligned, inside res,
// as long as b (ErrInvalidRange) and neither committed nor mapped
// (ErrCommitted). A view adds nothing to UsedBytes: b is counted once.
func (m *Mechanism) MapView(ctx context.Context, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	rs, err := m.reservationOf(op, res)
	if err != nil {
		return nil, err
	}
	bs, err := m.backingOf(op, b)
	if err != nil {
		return nil, err
	}
	if access != memapi.AccessReadOnly && access != memapi.AccessReadWrite {
		return nil, m.fail(op, memapi.ErrUnsupported, b.ID(), 0, 0, "access mode %v", access)
	}
	if err := m.checkRange(op, r, res); err != nil {
		return nil, err
	}
	if r.Len != b.Size() {
		return nil, m.fail(op, memapi.ErrInvalidRange, b.ID(), r.Len, b.Size(), "range %v does not have the backing's length", r)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.issuer.Check(op, res); err != nil {
		return nil, err
	}
	if err := m.issuer.Check(op, b); err != nil {
		return nil, err
	}
	if !rs.backed.free(r.Off, r.Off+r.Len) {
		return nil, m.fail(op, memapi.ErrCommitted, res.ID(), r.Len, 0, "part of %v is already committed or mapped", r)
	}
	err = m.fault(op, "mmap", uintptr(r.Len))
	if err == nil {
		err = mapShared(unsafe.Add(rs.ptr, r.Off), uintptr(r.Len), bs.fd, protOf(access))
	}
	if err != nil {
		// A failed MAP_FIXED may have taken the old mapping with it: put the
		// reserved space back so the reservation has no hole.
		_ = mapReserved(unsafe.Add(rs.ptr, r.Off), uintptr(r.Len))
		m.adviseHuge(unsafe.Add(rs.ptr, r.Off), uintptr(r.Len))
		return nil, m.errno(op, memapi.ErrOutOfMemory, err, "mmap shared")
	}
	vs := &view{res: rs, b: bs, off: r.Off, n: r.Len, access: access}
	rs.backed = rs.backed.insert(extent{off: r.Off, end: r.Off + r.Len, kind: extView, view: vs})
	rs.views++
	bs.views++
	return m.issuer.NewView(res, r, b, access, vs), nil
}

// backingOf returns the state of a live backing of this instance.
func (m *Mechanism) backingOf(op string, b *memapi.Backing) (*backing, error) {
	impl, err := m.issuer.Impl(op, b)
	if err != nil {
		return nil, err
	}
	return impl.(*backing), nil
}

// UnmapView puts PROT_NONE reserved space (MAP_FIXED|MAP_NORESERVE) over the
// view: the range stays reserved and never becomes a hole that another
// mapping could take. The backing stays alive.
func (m *Mechanism) UnmapView(ctx context.Context, v *memapi.View) error {
	const op = "SharedMapping.UnmapView"
	impl, err := m.issuer.BeginRelease(op, v)
	if err != nil {
		return err
	}
	vs := impl.(*view)
	m.mu.Lock()
	defer m.mu.Unlock()
	p := unsafe.Add(vs.res.ptr, vs.off)
	err = m.fault(op, "mmap", uintptr(vs.n))
	if err == nil {
		err = mapReserved(p, uintptr(vs.n))
	}
	if err != nil {
		m.issuer.EndRelease(v, false)
		return m.errno(op, memapi.ErrInvalidRange, err, "map reserved space over the view")
	}
	m.adviseHuge(p, uintptr(vs.n))
	if i := vs.res.backed.find(vs); i >= 0 {
		vs.res.backed = vs.res.backed.remove(i)
	}
	vs.res.views--
	vs.b.views--
	m.issuer.EndRelease(v, true)
	return nil
}

// CopyOnWrite gives v's range a private copy: a new memfd is filled with
// v's bytes (pwrite from the view, which allocates and charges its pages),
// mapped read-write over v with MAP_FIXED, and returned as a new View of a
// new Backing. v is released; its backing keeps its other views. Release
// the new backing with ReleaseBacking after unmapping the new view. If the
// kernel refuses the copy (ErrOutOfMemory), v stays mapped and live.
func (m *Mechanism) CopyOnWrite(ctx context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	impl, err := m.issuer.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	vs := impl.(*view)
	p := unsafe.Add(vs.res.ptr, vs.off)
	// v is ours (releasing) and mapped, and it keeps its reservation and
	// backing alive, so it can be read without the lock.
	fd, err := m.newMemfd(op, vs.n)
	if err == nil {
		if err = m.fault(op, "pwrite", uintptr(vs.n)); err == nil {
			err = pwriteAll(fd, bytesAt(p, uintptr(vs.n)), 0)
		}
		if err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		m.issuer.EndRelease(v, false)
		e := m.errno(op, memapi.ErrOutOfMemory, err, "copy into a new memfd").(*memapi.Error)
		e.Handle, e.Wanted = v.ID(), vs.n
		return nil, e
	}
	m.mu.Lock()
	err = m.fault(op, "mmap", uintptr(vs.n))
	if err == nil {
		err = mapShared(p, uintptr(vs.n), fd, unix.PROT_READ|unix.PROT_WRITE)
	}
	if err != nil {
		// Put the old view back (a failed MAP_FIXED may have removed it).
		if mapShared(p, uintptr(vs.n), vs.b.fd, protOf(vs.access)) != nil {
			// Cannot restore: leave reserved space, never a hole.
			_ = mapReserved(p, uintptr(vs.n))
		}
		m.mu.Unlock()
		_ = unix.Close(fd)
		m.issuer.EndRelease(v, false)
		return nil, m.errno(op, memapi.ErrOutOfMemory, err, "map the copy")
	}
	nb := &backing{fd: fd, size: vs.n, views: 1}
	nv := &view{res: vs.res, b: nb, off: vs.off, n: vs.n, access: memapi.AccessReadWrite}
	if i := vs.res.backed.find(vs); i >= 0 {
		vs.res.backed[i].view = nv
	}
	vs.b.views--
	m.backings[nb] = struct{}{}
	m.backingBytes.Add(uint64(vs.n))
	m.mu.Unlock()
	bh := m.issuer.NewBacking(vs.n, nb)
	m.issuer.EndRelease(v, true)
	return m.issuer.NewView(v.Reservation(), v.Range(), bh, memapi.AccessReadWrite, nv), nil
}

// ViewCount reports how many views of b are mapped.
func (m *Mechanism) ViewCount(b *memapi.Backing) (int, error) {
	bs, err := m.backingOf("SharedMapping.ViewCount", b)
	if err != nil {
		return 0, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	return bs.views, nil
}

// ReleaseBacking frees the backing's pages with fallocate(PUNCH_HOLE|
// KEEP_SIZE) (MADV_DONTNEED would not free a memfd's pages) and closes the
// memfd. It fails with ErrInUse, changing nothing, while views of b are
// mapped.
func (m *Mechanism) ReleaseBacking(ctx context.Context, b *memapi.Backing, to memapi.Account) error {
	const op = "SharedMapping.ReleaseBacking"
	impl, err := m.issuer.BeginRelease(op, b)
	if err != nil {
		return err
	}
	bs := impl.(*backing)
	m.mu.Lock()
	defer m.mu.Unlock()
	if bs.views > 0 {
		m.issuer.EndRelease(b, false)
		return m.fail(op, memapi.ErrInUse, b.ID(), 0, 0, "%d views of the backing are still mapped", bs.views)
	}
	err = m.fault(op, "fallocate", uintptr(bs.size))
	if err == nil {
		err = fallocate(bs.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(bs.size))
	}
	if err != nil {
		m.issuer.EndRelease(b, false)
		return m.errno(op, memapi.ErrInvalidRange, err, "punch hole")
	}
	// The pages are gone; close cannot fail in a way that keeps them.
	_ = unix.Close(bs.fd)
	bs.fd = -1
	delete(m.backings, bs)
	m.backingBytes.Add(-uint64(bs.size))
	m.issuer.EndRelease(b, true)
	return nil
}
