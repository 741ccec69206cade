package cuda

import (
	"context"
	"fmt"
	"slices"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// resState is the private state of a Reservation: a cuMemAddressReserve
// range split into granularity chunks, each empty, committed (its own
// physical handle, since a mapping can only be unmapped whole) or part of a
// view. Only non-empty chunks are stored, so a huge reservation (a KV cache's
// whole address range) costs nothing until it is backed.
type resState struct {
	h         *memapi.Reservation
	addr      uint64
	size      uint64
	chunks    map[int]chunk
	committed uint64
	views     int
}

// at returns chunk i (empty when nothing is installed there).
func (rs *resState) at(i int) chunk { return rs.chunks[i] }

// set stores chunk i, forgetting it when empty.
func (rs *resState) set(i int, c chunk) {
	if c.empty() {
		delete(rs.chunks, i)
		return
	}
	rs.chunks[i] = c
}

// mappedChunks returns the indices of the chunks with a private handle
// mapped (committed or spare), in order.
func (rs *resState) mappedChunks() []int {
	var idx []int
	for i, c := range rs.chunks {
		if c.handle != 0 {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	return idx
}

type chunk struct {
	handle  driver.MemHandle // the private handle installed by Commit (or kept as a spare), or 0
	view    *viewState       // the view mapped over this chunk, or nil
	spare   bool             // handle is mapped read-write but not committed (see spare.go)
	pending bool             // the refiller is mapping a spare here
}

func (c chunk) empty() bool { return c.handle == 0 && c.view == nil && !c.pending }

// committed reports whether Commit installed the chunk.
func (c chunk) committed() bool { return c.handle != 0 && !c.spare && !c.pending }

// checkRange validates r against res: inside (ErrInvalidRange), aligned to the
// granularity (ErrUnaligned). It returns the first chunk and the chunk count.
func (m *Mechanism) checkRange(op string, rs *resState, r memapi.Range) (int, int, error) {
	if !r.Within(memapi.Bytes(rs.size)) {
		return 0, 0, m.fail(op, memapi.ErrInvalidRange, rs.h, "range %v outside reservation of %d bytes", r, rs.size)
	}
	if !r.Aligned(memapi.Bytes(m.gran)) {
		return 0, 0, m.fail(op, memapi.ErrUnaligned, rs.h, "range %v not aligned to granularity %d", r, m.gran)
	}
	return int(uint64(r.Off) / m.gran), int(uint64(r.Len) / m.gran), nil
}

// Reserve obtains address space with cuMemAddressReserve, rounded up to the
// granularity and aligned to it: the alignment is passed explicitly, since
// the driver does not document what its default (0) gives, and cuMemMap
// needs granularity-aligned addresses. It holds no physical memory.
func (m *Mechanism) Reserve(ctx context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	const op = "VirtualBacking.Reserve"
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if req.Size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "zero size")
	}
	size, ok := roundUp(uint64(req.Size), m.gran)
	if !ok || size/m.gran > 1<<32 {
		return nil, m.fail(op, memapi.ErrInvalidSize, nil, "size %d is too large", req.Size)
	}
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	var ptr driver.DevicePtr
	if err := m.dev.do(func(t *driver.Table) error {
		return check(t, "cuMemAddressReserve", t.MemAddressReserve(&ptr, size, m.gran, 0, 0))
	}); err != nil {
		return nil, m.driverErr(op, err, size)
	}
	rs := &resState{addr: uint64(ptr), size: size, chunks: map[int]chunk{}}
	rs.h = m.issuer.NewReservation(memapi.DeviceAddr(ptr), memapi.Bytes(size), rs)
	m.reserves[rs] = struct{}{}
	m.regions.insert(region{start: rs.addr, end: rs.addr + size, res: rs})
	return rs.h, nil
}

// Commit installs one physical handle per granularity chunk of r (from the
// pool or cuMemCreate), maps each with cuMemMap, grants read-write access to
// the whole range with one cuMemSetAccess and clears it with cuMemsetD8,
// returning once the clear is done, so that work on any stream, a
// non-blocking one included, sees zeros (see zeroing.go). If any call fails,
// the calls made so far are undone and nothing is installed.
func (m *Mechanism) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return m.fail(op, memapi.ErrNoGrant, res, "a consuming call needs a grant")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	impl, err := m.issuer.Impl(op, res)
	if err != nil {
		return err
	}
	rs := impl.(*resState)
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := m.issuer.Check(op, res); err != nil {
		return err // released while we waited for the lock
	}
	first, n, err := m.checkRange(op, rs, r)
	if err != nil {
		return err
	}
	m.waitPending(rs, first, n)
	if err := m.issuer.Check(op, res); err != nil {
		return err
	}
	for i := first; i < first+n; i++ {
		if c := rs.at(i); !c.spare && !c.empty() {
			return m.fail(op, memapi.ErrCommitted, res, "chunk at offset %#x already has backing", uint64(i)*m.gran)
		}
	}
	// Claim the chunks (pending: copies, views, commits and releases keep
	// off) with the spares there and pool handles, then make the driver
	// calls without the lock, then settle.
	cl := m.claim(rs, first, n)
	m.mu.Unlock()
	err = m.install(rs, first, cl)
	m.mu.Lock()
	m.settle(rs, first, cl, err == nil)
	if err != nil {
		return m.driverErr(op, err, uint64(r.Len))
	}
	rs.committed += uint64(r.Len)
	m.used.Add(uint64(r.Len))
	m.hint(rs, first+n) // a growing reservation commits there next
	return nil
}

// claimed is what a Commit took for its chunks while it makes its driver
// calls outside the lock: per chunk, its handle (a spare's, a pool
// handle's, or 0 for one to create) and whether it was a spare.
type claimed struct {
	handles []driver.MemHandle
	spare   []bool
	spares  int
}

// claim marks chunks [first, first+n) of rs pending and takes their spares
// and pool handles, with m.mu held.
func (m *Mechanism) claim(rs *resState, first, n int) *claimed {
	cl := &claimed{handles: make([]driver.MemHandle, n), spare: make([]bool, n)}
	for i := range n {
		c := rs.at(first + i)
		switch {
		case c.spare:
			cl.handles[i], cl.spare[i] = c.handle, true
			cl.spares++
			m.spares--
		case len(m.pool) > 0:
			cl.handles[i], m.pool = m.pool[len(m.pool)-1], m.pool[:len(m.pool)-1]
		default:
			continue // created by install
		}
		m.pooled.Add(^(m.gran - 1))
	}
	for i := range n {
		rs.set(first+i, chunk{handle: cl.handles[i], pending: true})
	}
	m.inflight++
	return cl
}

// install makes the claimed chunks committed memory, without m.mu, on the
// device thread: cuMemCreate for those without a handle, cuMemMap for all
// but the spares, one cuMemSetAccess over the range unless all were spares,
// and one cuMemsetD8, which it waits for (see zeroing.go). If a call fails
// the calls made so far are undone (handles it created released, mappings
// removed).
func (m *Mechanism) install(rs *resState, first int, cl *claimed) error {
	n := len(cl.handles)
	base := rs.addr + uint64(first)*m.gran
	var x *txn
	var ev driver.Event
	if err := m.dev.do(func(t *driver.Table) error {
		x = m.txn(t)
		for i := range n {
			if cl.spare[i] {
				continue // mapped and read-write already
			}
			if cl.handles[i] == 0 {
				h, err := m.createHandle(x, m.gran)
				if err != nil {
					return err
				}
				cl.handles[i] = h
				x.onRollback(func() { cl.handles[i] = 0 })
			}
			addr := driver.DevicePtr(base + uint64(i)*m.gran)
			if err := x.step("cuMemMap", t.MemMap(addr, m.gran, 0, cl.handles[i], 0), func() {
				x.quiet("cuMemUnmap", m.dev.unmap(t, addr, m.gran))
			}); err != nil {
				return err
			}
		}
		size := uint64(n) * m.gran
		if cl.spares < n {
			if err := x.step("cuMemSetAccess", t.MemSetAccess(driver.DevicePtr(base), size, &m.rw, 1), nil); err != nil {
				return err
			}
		}
		if err := x.step("cuMemsetD8_v2", t.MemsetD8(driver.DevicePtr(base), 0, size), nil); err != nil {
			return err
		}
		m.dev.queued()
		var err error
		ev, err = m.recordClear(x)
		return err
	}); err != nil {
		return err
	}
	return m.awaitClear(x, ev)
}

// settle ends a claim with m.mu held: the chunks become committed, or, when
// install failed, go back to what they were (spares stay spares, pool
// handles return to the pool).
func (m *Mechanism) settle(rs *resState, first int, cl *claimed, ok bool) {
	for i, h := range cl.handles {
		switch {
		case ok:
			rs.set(first+i, chunk{handle: h})
		case cl.spare[i]:
			rs.set(first+i, chunk{handle: h, spare: true})
			m.spares++
			m.pooled.Add(m.gran)
		default:
			rs.set(first+i, chunk{})
			if h != 0 {
				m.pool = append(m.pool, h)
				m.pooled.Add(m.gran)
			}
		}
	}
	m.inflight--
	m.settled.Broadcast()
}

// Decommit unmaps each chunk of r and returns its handle to the pool or the
// driver. r must be wholly committed by Commit (ErrNotCommitted otherwise;
// chunks under a view are not committed). If an unmap fails, the chunks
// already unmapped are mapped back with their handles: their bytes are intact.
func (m *Mechanism) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, _ memapi.Account) error {
	const op = "VirtualBacking.Decommit"
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	impl, err := m.issuer.Impl(op, res)
	if err != nil {
		return err
	}
	rs := impl.(*resState)
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := m.issuer.Check(op, res); err != nil {
		return err
	}
	first, n, err := m.checkRange(op, rs, r)
	if err != nil {
		return err
	}
	for i := first; i < first+n; i++ {
		if !rs.at(i).committed() {
			return m.fail(op, memapi.ErrNotCommitted, res, "chunk at offset %#x is not committed", uint64(i)*m.gran)
		}
	}
	// The first chunks stay mapped as spares while there is room (a region
	// that shrank grows back there; their room is held in m.pendings
	// meanwhile); the rest are unmapped, without the lock: every chunk is
	// pending until the Decommit settles.
	keep := min(n, m.spareMax-m.spares-m.pendings, m.poolMax-len(m.pool)-m.spares-m.pendings)
	keep = max(keep, 0)
	handles := make([]driver.MemHandle, n)
	for i := range n {
		handles[i] = rs.at(first + i).handle
		rs.set(first+i, chunk{handle: handles[i], pending: true})
	}
	m.pendings += keep
	m.inflight++
	if keep < n {
		m.mu.Unlock()
		err = m.dev.do(func(t *driver.Table) error {
			return m.unmapChunks(m.txn(t), rs, first+keep, handles[keep:])
		})
		m.mu.Lock()
	}
	m.pendings -= keep
	m.inflight--
	defer m.settled.Broadcast()
	if err != nil {
		for i, h := range handles {
			rs.set(first+i, chunk{handle: h}) // mapped back by the undo
		}
		return m.driverErr(op, err, 0)
	}
	for i := range keep {
		m.keepSpare(rs, first+i) // before recycle, so the pool sees the spares
	}
	if keep < n {
		_ = m.dev.do(func(t *driver.Table) error {
			for _, h := range handles[keep:] {
				m.recycle(t, h, m.gran)
			}
			return nil
		})
	}
	for i := first + keep; i < first+n; i++ {
		rs.set(i, chunk{})
	}
	rs.committed -= uint64(r.Len)
	m.used.Add(^(uint64(r.Len) - 1))
	return nil
}

// unmapChunks unmaps the committed chunks from first, whose handles are
// given (it reads no chunk state, so it may run without m.mu), registering
// for each a remap (cuMemMap + cuMemSetAccess read-write) as its undo.
func (m *Mechanism) unmapChunks(x *txn, rs *resState, first int, handles []driver.MemHandle) error {
	t := x.t
	if err := x.settle(m.dev); err != nil {
		return err
	}
	for j, h := range handles {
		i := first + j
		addr := driver.DevicePtr(rs.addr + uint64(i)*m.gran)
		if err := x.step("cuMemUnmap", t.MemUnmap(addr, m.gran), func() {
			x.quiet("cuMemMap", t.MemMap(addr, m.gran, 0, h, 0))
			x.quiet("cuMemSetAccess", t.MemSetAccess(addr, m.gran, &m.rw, 1))
		}); err != nil {
			return err
		}
	}
	return nil
}

// CommittedBytes reports the bytes of res installed by Commit (views excluded).
func (m *Mechanism) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	const op = "VirtualBacking.CommittedBytes"
	impl, err := m.issuer.Impl(op, res)
	if err != nil {
		return 0, err
	}
	if err := m.enter(op); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	return memapi.Bytes(impl.(*resState).committed), nil
}

// ReleaseReservation unmaps what is still committed, frees the address range
// with cuMemAddressFree and only then releases the handles, so a failure at
// any step maps everything back. It fails with ErrInUse while views are
// mapped in res.
func (m *Mechanism) ReleaseReservation(ctx context.Context, res *memapi.Reservation, _ memapi.Account) error {
	const op = "VirtualBacking.ReleaseReservation"
	impl, err := m.issuer.BeginRelease(op, res)
	if err != nil {
		return err
	}
	ok := false
	defer func() { m.issuer.EndRelease(res, ok) }()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	rs := impl.(*resState)
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if rs.views > 0 {
		return m.fail(op, memapi.ErrInUse, res, "%d views are mapped in it", rs.views)
	}
	m.waitPending(rs, 0, int(rs.size/m.gran))
	err = m.dev.do(func(t *driver.Table) error {
		x := m.txn(t)
		committed := rs.mappedChunks()
		for _, i := range committed {
			if err := m.unmapChunks(x, rs, i, []driver.MemHandle{rs.at(i).handle}); err != nil {
				return err
			}
		}
		if err := x.step("cuMemAddressFree", t.MemAddressFree(driver.DevicePtr(rs.addr), rs.size), nil); err != nil {
			return err
		}
		for _, i := range committed {
			if c := rs.at(i); c.spare {
				m.spares--
				m.pooled.Add(^(m.gran - 1))
			}
			m.recycle(t, rs.at(i).handle, m.gran)
		}
		return nil
	})
	if err != nil {
		return m.driverErr(op, err, 0)
	}
	delete(m.reserves, rs)
	m.regions.remove(rs.addr)
	m.used.Add(^(rs.committed - 1))
	rs.committed = 0
	ok = true
	return nil
}
