package cuda

import (
	"context"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// backingState is the private state of a Backing: one cuMemCreate handle,
// mappable whole at several addresses. cleared records that its bytes were
// zeroed (done before its first view, since the handle may be recycled).
type backingState struct {
	h       *memapi.Backing
	handle  driver.MemHandle
	size    uint64
	views   int
	cleared bool
}

// viewState is the private state of a View: the backing's handle mapped over
// [off, off+len) of a reservation with its own access.
type viewState struct {
	h      *memapi.View
	res    *resState
	off    uint64
	len    uint64
	b      *backingState
	access memapi.Access
}

func (m *Mechanism) accessDesc(a memapi.Access) *driver.MemAccessDesc {
	if a == memapi.AccessReadOnly {
		return &m.ro
	}
	return &m.rw
}

// CreateBacking obtains size bytes (rounded up to the granularity) of
// physical memory as one handle: from the pool when it is one chunk, else
// cuMemCreate. It is mapped nowhere yet.
func (m *Mechanism) CreateBacking(ctx context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, nil, "a consuming call needs a grant")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "zero size")
	}
	n, ok := roundUp(uint64(size), m.gran)
	if !ok {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "size %d is too large", size)
	}
	if err := m.beyondDevice(op, n); err != nil {
		return nil, err
	}
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var h driver.MemHandle
	err := m.dev.do(func(t *driver.Table) error {
		x := m.txn(t)
		var err error
		if n == m.gran {
			h, err = m.chunkHandle(x)
		} else {
			h, err = m.createHandle(x, n)
		}
		return err
	})
	if err != nil {
		return nil, m.driverErr(op, err, n)
	}
	bs := &backingState{handle: h, size: n}
	bs.h = m.issuer.NewBacking(memapi.Bytes(n), bs)
	m.backings[bs] = struct{}{}
	m.used.Add(n)
	return bs.h, nil
}

// MapView maps the whole backing at r with cuMemMap and sets the view's
// access with cuMemSetAccess (PROT_READ or PROT_READWRITE). A backing's first
// view clears it first, through a read-write mapping, and returns once the
// clear is done (see zeroing.go).
func (m *Mechanism) MapView(ctx context.Context, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if !access.Valid() {
		return nil, m.fail(op, memapi.ErrUnsupported, nil, "access %v", access)
	}
	rimpl, err := m.issuer.Impl(op, res)
	if err != nil {
		return nil, err
	}
	bimpl, err := m.issuer.Impl(op, b)
	if err != nil {
		return nil, err
	}
	rs, bs := rimpl.(*resState), bimpl.(*backingState)
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if err := m.issuer.Check(op, res); err != nil {
		return nil, err
	}
	if err := m.issuer.Check(op, b); err != nil {
		return nil, err
	}
	first, n, err := m.checkRange(op, rs, r)
	if err != nil {
		return nil, err
	}
	if uint64(r.Len) != bs.size {
		return nil, m.fail(op, memapi.ErrInvalidRange, b, "range %v is not as long as the backing (%d bytes)", r, bs.size)
	}
	m.waitPending(rs, first, n)
	if err := m.issuer.Check(op, res); err != nil {
		return nil, err
	}
	for i := first; i < first+n; i++ {
		if c := rs.at(i); !c.empty() && !c.spare {
			return nil, m.fail(op, memapi.ErrCommitted, res, "chunk at offset %#x already has backing", uint64(i)*m.gran)
		}
	}
	addr := driver.DevicePtr(rs.addr + uint64(r.Off))
	var x *txn
	var ev driver.Event
	err = m.dev.do(func(t *driver.Table) error {
		x = m.txn(t)
		if err := m.evictSpares(x, rs, first, n); err != nil {
			return err
		}
		if err := x.step("cuMemMap", t.MemMap(addr, bs.size, 0, bs.handle, 0), func() {
			x.quiet("cuMemUnmap", m.dev.unmap(t, addr, bs.size))
		}); err != nil {
			return err
		}
		if bs.cleared {
			return x.step("cuMemSetAccess", t.MemSetAccess(addr, bs.size, m.accessDesc(access), 1), nil)
		}
		if err := x.step("cuMemSetAccess", t.MemSetAccess(addr, bs.size, &m.rw, 1), nil); err != nil {
			return err
		}
		if err := x.step("cuMemsetD8_v2", t.MemsetD8(addr, 0, bs.size), nil); err != nil {
			return err
		}
		m.dev.queued()
		var err error
		ev, err = m.recordClear(x)
		return err
	})
	if err == nil && !bs.cleared {
		// The clear is waited for (see zeroing.go); only then may the
		// mapping turn read-only.
		err = m.awaitClear(x, ev)
		if err == nil && access == memapi.AccessReadOnly {
			err = m.dev.do(func(t *driver.Table) error {
				return x.step("cuMemSetAccess", t.MemSetAccess(addr, bs.size, &m.ro, 1), nil)
			})
		}
	}
	if err != nil {
		return nil, m.driverErr(op, err, 0)
	}
	bs.cleared = true
	vs := &viewState{res: rs, off: uint64(r.Off), len: bs.size, b: bs, access: access}
	vs.h = m.issuer.NewView(res, r, b, access, vs)
	m.attach(vs, first, n)
	return vs.h, nil
}

func (m *Mechanism) attach(vs *viewState, first, n int) {
	for i := first; i < first+n; i++ {
		vs.res.set(i, chunk{view: vs})
	}
	vs.res.views++
	vs.b.views++
}

func (m *Mechanism) detach(vs *viewState) {
	first := int(vs.off / m.gran)
	for i := first; i < first+int(vs.len/m.gran); i++ {
		vs.res.set(i, chunk{})
	}
	vs.res.views--
	vs.b.views--
}

// UnmapView removes the view's mapping with cuMemUnmap; the range stays
// reserved and the backing alive.
func (m *Mechanism) UnmapView(ctx context.Context, v *memapi.View) error {
	const op = "SharedMapping.UnmapView"
	impl, err := m.issuer.BeginRelease(op, v)
	if err != nil {
		return err
	}
	ok := false
	defer func() { m.issuer.EndRelease(v, ok) }()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	vs := impl.(*viewState)
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := m.dev.do(func(t *driver.Table) error {
		if err := m.dev.settle(t); err != nil {
			return err
		}
		return check(t, "cuMemUnmap", t.MemUnmap(driver.DevicePtr(vs.res.addr+vs.off), vs.len))
	}); err != nil {
		return m.driverErr(op, err, 0)
	}
	m.detach(vs)
	ok = true
	return nil
}

// CopyOnWrite gives v's range a private copy: a new handle (pool or
// cuMemCreate) is mapped read-write at a scratch reservation (aligned to the
// granularity, as Reserve's are), filled with
// cuMemcpyDtoD from v, unmapped there, and mapped read-write in v's place
// (cuMemUnmap of v, cuMemMap, cuMemSetAccess).
// Any failure undoes every step: v stays mapped as it was.
func (m *Mechanism) CopyOnWrite(ctx context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, v, "a consuming call needs a grant")
	}
	impl, err := m.issuer.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() { m.issuer.EndRelease(v, ok) }()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	vs := impl.(*viewState)
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	size := vs.len
	addr := driver.DevicePtr(vs.res.addr + vs.off)
	var h driver.MemHandle
	err = m.dev.do(func(t *driver.Table) error {
		x := m.txn(t)
		var err error
		if size == m.gran {
			h, err = m.chunkHandle(x)
		} else {
			h, err = m.createHandle(x, size)
		}
		if err != nil {
			return err
		}
		// The scratch mapping exists only for the copy: its own transaction
		// removes it whether the copy worked or not.
		sx := m.txn(t)
		err = func() error {
			var tmp driver.DevicePtr
			if err := sx.step("cuMemAddressReserve", t.MemAddressReserve(&tmp, size, m.gran, 0, 0), func() {
				sx.quiet("cuMemAddressFree", t.MemAddressFree(tmp, size))
			}); err != nil {
				return err
			}
			if err := sx.step("cuMemMap", t.MemMap(tmp, size, 0, h, 0), func() {
				sx.quiet("cuMemUnmap", m.dev.unmap(t, tmp, size))
			}); err != nil {
				return err
			}
			if err := sx.step("cuMemSetAccess", t.MemSetAccess(tmp, size, &m.rw, 1), nil); err != nil {
				return err
			}
			if err := sx.step("cuMemcpyDtoD_v2", t.MemcpyDtoD(tmp, addr, size), nil); err != nil {
				return err
			}
			m.dev.queued()
			// The copy must be over before the scratch range is unmapped.
			return sx.settle(m.dev)
		}()
		sx.rollback()
		if err != nil {
			x.rollback()
			return err
		}
		old := vs.b.handle
		if err := x.step("cuMemUnmap", t.MemUnmap(addr, size), func() {
			x.quiet("cuMemMap", t.MemMap(addr, size, 0, old, 0))
			x.quiet("cuMemSetAccess", t.MemSetAccess(addr, size, m.accessDesc(vs.access), 1))
		}); err != nil {
			return err
		}
		if err := x.step("cuMemMap", t.MemMap(addr, size, 0, h, 0), func() {
			x.quiet("cuMemUnmap", m.dev.unmap(t, addr, size))
		}); err != nil {
			return err
		}
		return x.step("cuMemSetAccess", t.MemSetAccess(addr, size, &m.rw, 1), nil)
	})
	if err != nil {
		return nil, m.driverErr(op, err, size)
	}
	nb := &backingState{handle: h, size: size, views: 0, cleared: true}
	nb.h = m.issuer.NewBacking(memapi.Bytes(size), nb)
	m.backings[nb] = struct{}{}
	m.used.Add(size)
	first, n := int(vs.off/m.gran), int(size/m.gran)
	m.detach(vs)
	nv := &viewState{res: vs.res, off: vs.off, len: size, b: nb, access: memapi.AccessReadWrite}
	nv.h = m.issuer.NewView(vs.res.h, v.Range(), nb.h, memapi.AccessReadWrite, nv)
	m.attach(nv, first, n)
	ok = true
	return nv.h, nil
}

// ViewCount reports how many views of b are mapped.
func (m *Mechanism) ViewCount(b *memapi.Backing) (int, error) {
	const op = "SharedMapping.ViewCount"
	impl, err := m.issuer.Impl(op, b)
	if err != nil {
		return 0, err
	}
	if err := m.enter(op); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	return impl.(*backingState).views, nil
}

// ReleaseBacking gives b's handle back (pool or cuMemRelease). It fails with
// ErrInUse while views of b are mapped: the driver would only free the memory
// at the last unmap, and the ledger must not be refunded before that.
func (m *Mechanism) ReleaseBacking(ctx context.Context, b *memapi.Backing, _ memapi.Account) error {
	const op = "SharedMapping.ReleaseBacking"
	impl, err := m.issuer.BeginRelease(op, b)
	if err != nil {
		return err
	}
	ok := false
	defer func() { m.issuer.EndRelease(b, ok) }()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	bs := impl.(*backingState)
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if bs.views > 0 {
		return m.fail(op, memapi.ErrInUse, b, "%d views are mapped", bs.views)
	}
	_ = m.dev.do(func(t *driver.Table) error {
		m.recycle(t, bs.handle, bs.size)
		return nil
	})
	delete(m.backings, bs)
	m.used.Add(^(bs.size - 1))
	ok = true
	return nil
}
