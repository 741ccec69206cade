package checkedtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
)

// method numbers the capability methods, for per-method call counts and faults.
type method int

const (
	mAllocate method = iota
	mFree
	mReserve
	mCommit
	mDecommit
	mCommittedBytes
	mReleaseReservation
	mCreateBacking
	mMapView
	mUnmapView
	mCopyOnWrite
	mViewCount
	mReleaseBacking
	nMethods
)

var methodNames = [nMethods]string{
	"Allocate", "Free", "Reserve", "Commit", "Decommit", "CommittedBytes", "ReleaseReservation",
	"CreateBacking", "MapView", "UnmapView", "CopyOnWrite", "ViewCount", "ReleaseBacking",
}

func (k method) String() string { return methodNames[k] }

// bugs are deliberate defects, for the meta-tests: each is a way a real
// mechanism has been (or could be) wrong that the wrapper must catch.
type bugs struct {
	commitNoop       bool // Commit succeeds and installs nothing (an eager allocator)
	decommitNoop     bool // Decommit succeeds and frees nothing
	eagerReserve     bool // Reserve takes the whole size at once
	commitCountsOnce bool // CommittedBytes counts each Commit call as one granule, whatever its length
	ignoreAllocRound bool // Allocate takes req.Size bytes, ignoring the allocation granularity
	ignoreAlignment  bool // Commit accepts unaligned ranges
	freeAnyHandle    bool // Free frees any allocation, whoever made it
	partialCommit    bool // Commit of more than one granule installs the first and then fails
	commitExtra      bool // Commit installs one granule more than asked (past the range's end)
	freeKeepsLive    bool // Free frees the memory but leaves the handle live
	unmapFailsLate   bool // UnmapView releases the view and then reports a failure
	allocForeign     bool // Allocate returns a handle stamped by another instance
}

// mech is a small, honest in-memory mechanism offering every capability
// (or the subset in offers), with per-method call counts, one-shot faults and
// optional bugs. Its counters are exact: UsedBytes is allocations + committed
// chunks + backings.
type mech struct {
	iss    *memapi.Issuer
	info   memapi.MechanismInfo
	offers memapi.CapSet
	bug    bugs
	calls  [nMethods]atomic.Int64

	mu       sync.Mutex
	used     memapi.Bytes
	capacity memapi.Bytes // 0: unlimited
	nextAddr memapi.DeviceAddr
	faults   [nMethods]error
	panics   [nMethods]any
}

type resState struct {
	chunks    map[memapi.Bytes]bool // chunk offset -> committed (true) or view-mapped (false)
	committed memapi.Bytes
	counted   memapi.Bytes // what CommittedBytes reports under commitCountsOnce
	views     int
}

type backState struct{ views int }

type viewState struct {
	rs *resState
	bs *backState
}

const (
	testAllocGran = 4096
	testGran      = 65536
)

func newMech(authority memapi.AuthorityID, offers memapi.CapSet) *mech {
	iss := memapi.NewIssuer()
	if offers == 0 {
		offers = memapi.Of(memapi.Capabilities...)
	}
	return &mech{
		iss: iss,
		info: memapi.MechanismInfo{
			Mechanism: "checkedtest", Instance: iss.Instance(), Authority: authority,
			Device:           memapi.DeviceKey{Kind: memapi.DeviceKindHost},
			AllocGranularity: testAllocGran, Granularity: testGran,
		},
		offers:   offers,
		nextAddr: 1 << 32,
	}
}

var _ memapi.Mechanism = (*mech)(nil)
var _ memapi.VirtualBacking = (*mech)(nil)
var _ memapi.SharedMapping = (*mech)(nil)

// count returns how many times the mechanism's method k ran.
func (m *mech) count(k method) int64 { return m.calls[k].Load() }

// totalCalls counts every mutating or querying call except Info and UsedBytes.
func (m *mech) totalCalls() int64 {
	var n int64
	for k := range m.calls {
		n += m.calls[k].Load()
	}
	return n
}

// failNext makes the next call of k fail with err before it changes anything.
func (m *mech) failNext(k method, err error) {
	m.mu.Lock()
	m.faults[k] = err
	m.mu.Unlock()
}

// panicNext makes the next call of k panic with v before it changes anything.
func (m *mech) panicNext(k method, v any) {
	m.mu.Lock()
	m.panics[k] = v
	m.mu.Unlock()
}

// enter counts a call and returns its injected fault, or panics with the
// injected panic; m.mu is held (and released by the caller's deferred unlock).
func (m *mech) enter(k method) error {
	m.calls[k].Add(1)
	if v := m.panics[k]; v != nil {
		m.panics[k] = nil
		panic(v)
	}
	err := m.faults[k]
	m.faults[k] = nil
	return err
}

func (m *mech) fail(op string, kind error, format string, args ...any) error {
	e := memapi.Errorf(op, kind, format, args...)
	e.Mechanism, e.Authority = m.info.Mechanism, m.info.Authority
	return e
}

// take reserves n physical bytes against the capacity; m.mu is held.
func (m *mech) take(op string, n memapi.Bytes) error {
	if m.capacity != 0 && m.used+n > m.capacity {
		e := &memapi.Error{Op: op, Kind: memapi.ErrOutOfMemory, Wanted: n, Available: m.capacity - m.used}
		return e
	}
	m.used += n
	return nil
}

func (m *mech) Info() memapi.MechanismInfo { return m.info }

func (m *mech) AsVirtualBacking() (memapi.VirtualBacking, bool) {
	if !m.offers.Has(memapi.CapVirtualBacking) {
		return nil, false
	}
	return m, true
}

func (m *mech) AsSharedMapping() (memapi.SharedMapping, bool) {
	if !m.offers.Has(memapi.CapSharedMapping) {
		return nil, false
	}
	return m, true
}

func (m *mech) UsedBytes() memapi.Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

func (m *mech) Allocate(_ context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mAllocate); err != nil {
		return nil, err
	}
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, "no grant")
	}
	if req.Size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, "zero size")
	}
	n, ok := memapi.RoundUp(req.Size, m.info.AllocGranularity)
	if !ok {
		return nil, m.fail(op, memapi.ErrInvalidSize, "size %d overflows", req.Size)
	}
	if m.bug.ignoreAllocRound {
		n = req.Size
	}
	if err := m.take(op, n); err != nil {
		return nil, err
	}
	addr := m.nextAddr
	m.nextAddr += memapi.DeviceAddr(n)
	if m.bug.allocForeign {
		return memapi.NewIssuer().NewAllocation(addr, n, nil), nil
	}
	return m.iss.NewAllocation(addr, n, nil), nil
}

func (m *mech) Free(_ context.Context, a *memapi.Allocation, _ memapi.Account) error {
	const op = "DeviceAllocator.Free"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mFree); err != nil {
		return err
	}
	if m.bug.freeAnyHandle || m.bug.freeKeepsLive {
		m.used -= a.Size()
		return nil
	}
	if _, err := m.iss.BeginRelease(op, a); err != nil {
		return err
	}
	m.used -= a.Size()
	m.iss.EndRelease(a, true)
	return nil
}

func (m *mech) Reserve(_ context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	const op = "VirtualBacking.Reserve"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mReserve); err != nil {
		return nil, err
	}
	if req.Size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, "zero size")
	}
	n, ok := memapi.RoundUp(req.Size, m.info.Granularity)
	if !ok {
		return nil, m.fail(op, memapi.ErrInvalidSize, "size %d overflows", req.Size)
	}
	if m.bug.eagerReserve {
		if err := m.take(op, n); err != nil {
			return nil, err
		}
	}
	addr := m.nextAddr
	m.nextAddr += memapi.DeviceAddr(n)
	return m.iss.NewReservation(addr, n, &resState{chunks: map[memapi.Bytes]bool{}}), nil
}

// ranged checks a range of a live reservation; m.mu is held.
func (m *mech) ranged(op string, res *memapi.Reservation, r memapi.Range, aligned bool) (*resState, error) {
	impl, err := m.iss.Impl(op, res)
	if err != nil {
		return nil, err
	}
	if !r.Within(res.Size()) {
		return nil, m.fail(op, memapi.ErrInvalidRange, "range %v outside %#x", r, res.Size())
	}
	if aligned && !r.Aligned(m.info.Granularity) {
		return nil, m.fail(op, memapi.ErrUnaligned, "range %v", r)
	}
	return impl.(*resState), nil
}

func (m *mech) Commit(_ context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mCommit); err != nil {
		return err
	}
	if grant == nil {
		return m.fail(op, memapi.ErrNoGrant, "no grant")
	}
	rs, err := m.ranged(op, res, r, !m.bug.ignoreAlignment)
	if err != nil {
		return err
	}
	if m.bug.commitNoop {
		return nil
	}
	start := r.Off - r.Off%testGran
	for off := start; off < r.Off+r.Len; off += testGran {
		if _, ok := rs.chunks[off]; ok {
			return m.fail(op, memapi.ErrCommitted, "chunk %#x", off)
		}
	}
	n := r.Len
	if m.bug.partialCommit && r.Len > testGran {
		n = testGran
	}
	if m.bug.ignoreAlignment {
		n, _ = memapi.RoundUp(r.Off+r.Len-start, testGran)
	}
	if m.bug.commitExtra {
		n += testGran
	}
	if err := m.take(op, n); err != nil {
		return err
	}
	for off := start; off < start+n; off += testGran {
		rs.chunks[off] = true
	}
	rs.committed += n
	rs.counted += testGran
	if n < r.Len {
		return m.fail(op, memapi.ErrOutOfMemory, "gave up after %#x bytes", n)
	}
	return nil
}

func (m *mech) Decommit(_ context.Context, res *memapi.Reservation, r memapi.Range, _ memapi.Account) error {
	const op = "VirtualBacking.Decommit"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mDecommit); err != nil {
		return err
	}
	rs, err := m.ranged(op, res, r, true)
	if err != nil {
		return err
	}
	for off := r.Off; off < r.Off+r.Len; off += testGran {
		if c, ok := rs.chunks[off]; !ok || !c {
			return m.fail(op, memapi.ErrNotCommitted, "chunk %#x", off)
		}
	}
	if m.bug.decommitNoop {
		return nil
	}
	for off := r.Off; off < r.Off+r.Len; off += testGran {
		delete(rs.chunks, off)
	}
	rs.committed -= r.Len
	rs.counted -= min(rs.counted, r.Len)
	m.used -= r.Len
	return nil
}

func (m *mech) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mCommittedBytes); err != nil {
		return 0, err
	}
	impl, err := m.iss.Impl("VirtualBacking.CommittedBytes", res)
	if err != nil {
		return 0, err
	}
	rs := impl.(*resState)
	if m.bug.commitCountsOnce {
		return rs.counted, nil
	}
	return rs.committed, nil
}

func (m *mech) ReleaseReservation(_ context.Context, res *memapi.Reservation, _ memapi.Account) error {
	const op = "VirtualBacking.ReleaseReservation"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mReleaseReservation); err != nil {
		return err
	}
	impl, err := m.iss.BeginRelease(op, res)
	if err != nil {
		return err
	}
	rs := impl.(*resState)
	if rs.views > 0 {
		m.iss.EndRelease(res, false)
		return m.fail(op, memapi.ErrInUse, "%d views mapped", rs.views)
	}
	m.used -= rs.committed
	if m.bug.eagerReserve {
		m.used -= res.Size()
	}
	rs.committed, rs.chunks = 0, nil
	m.iss.EndRelease(res, true)
	return nil
}

func (m *mech) CreateBacking(_ context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mCreateBacking); err != nil {
		return nil, err
	}
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, "no grant")
	}
	if size == 0 {
		return nil, m.fail(op, memapi.ErrInvalidSize, "zero size")
	}
	n, ok := memapi.RoundUp(size, m.info.Granularity)
	if !ok {
		return nil, m.fail(op, memapi.ErrInvalidSize, "size %d overflows", size)
	}
	if err := m.take(op, n); err != nil {
		return nil, err
	}
	return m.iss.NewBacking(n, &backState{}), nil
}

func (m *mech) MapView(_ context.Context, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mMapView); err != nil {
		return nil, err
	}
	rs, err := m.ranged(op, res, r, true)
	if err != nil {
		return nil, err
	}
	bi, err := m.iss.Impl(op, b)
	if err != nil {
		return nil, err
	}
	if r.Len != b.Size() {
		return nil, m.fail(op, memapi.ErrInvalidRange, "range %v for a backing of %#x", r, b.Size())
	}
	if !access.Valid() {
		return nil, m.fail(op, memapi.ErrInvalidRange, "access %v", access)
	}
	for off := r.Off; off < r.Off+r.Len; off += testGran {
		if _, ok := rs.chunks[off]; ok {
			return nil, m.fail(op, memapi.ErrCommitted, "chunk %#x", off)
		}
	}
	for off := r.Off; off < r.Off+r.Len; off += testGran {
		rs.chunks[off] = false
	}
	bs := bi.(*backState)
	rs.views++
	bs.views++
	return m.iss.NewView(res, r, b, access, &viewState{rs: rs, bs: bs}), nil
}

// unmap removes a view's chunks; m.mu is held.
func unmap(v *memapi.View, vs *viewState) {
	r := v.Range()
	for off := r.Off; off < r.Off+r.Len; off += testGran {
		delete(vs.rs.chunks, off)
	}
	vs.rs.views--
	vs.bs.views--
}

func (m *mech) UnmapView(_ context.Context, v *memapi.View) error {
	const op = "SharedMapping.UnmapView"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mUnmapView); err != nil {
		return err
	}
	impl, err := m.iss.BeginRelease(op, v)
	if err != nil {
		return err
	}
	unmap(v, impl.(*viewState))
	m.iss.EndRelease(v, true)
	if m.bug.unmapFailsLate {
		return m.fail(op, memapi.ErrInUse, "changed its mind")
	}
	return nil
}

func (m *mech) CopyOnWrite(_ context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mCopyOnWrite); err != nil {
		return nil, err
	}
	if grant == nil {
		return nil, m.fail(op, memapi.ErrNoGrant, "no grant")
	}
	impl, err := m.iss.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	n := v.Range().Len
	if err := m.take(op, n); err != nil {
		m.iss.EndRelease(v, false)
		return nil, err
	}
	vs := impl.(*viewState)
	vs.bs.views--
	nb := &backState{views: 1}
	b := m.iss.NewBacking(n, nb)
	m.iss.EndRelease(v, true)
	return m.iss.NewView(v.Reservation(), v.Range(), b, memapi.AccessReadWrite, &viewState{rs: vs.rs, bs: nb}), nil
}

func (m *mech) ViewCount(b *memapi.Backing) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mViewCount); err != nil {
		return 0, err
	}
	impl, err := m.iss.Impl("SharedMapping.ViewCount", b)
	if err != nil {
		return 0, err
	}
	return impl.(*backState).views, nil
}

func (m *mech) ReleaseBacking(_ context.Context, b *memapi.Backing, _ memapi.Account) error {
	const op = "SharedMapping.ReleaseBacking"
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.enter(mReleaseBacking); err != nil {
		return err
	}
	impl, err := m.iss.BeginRelease(op, b)
	if err != nil {
		return err
	}
	if v := impl.(*backState).views; v > 0 {
		m.iss.EndRelease(b, false)
		return m.fail(op, memapi.ErrInUse, "%d views mapped", v)
	}
	m.used -= b.Size()
	m.iss.EndRelease(b, true)
	return nil
}

func (m *mech) String() string { return fmt.Sprintf("mech(instance %d)", m.info.Instance) }
