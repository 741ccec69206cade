package plugin

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

// Options configures a Mechanism.
type Options struct {
	// Authority the plugin's memory is accounted to; "" means "host" for a
	// plugin serving host memory and "<name>:<ordinal>" otherwise.
	Authority memapi.AuthorityID
}

// Mechanism is one instance of a plugin presented as a memapi.Mechanism. The
// Go side keeps the contract's handles (memapi.Issuer): it refuses nil,
// foreign and released handles before any slot is called, and moves each
// handle from live to released exactly once, so a plugin sees only live ids
// of its own instance and each release once. The plugin never sees a grant
// or an account; run the mechanism through checked.Wrap, which draws and
// refunds around every call, as for any mechanism.
//
// What the plugin returns is checked before it becomes a handle: a new id
// must be nonzero and not already live, and sizes and fields must be what
// was asked for; otherwise the call fails with ErrProtocol, after giving
// back through the plugin whatever it created. A Mechanism is safe for
// concurrent use.
type Mechanism struct {
	lib    *Library
	info   memapi.MechanismInfo
	issuer *memapi.Issuer
	inst   uintptr // the plugin's instance pointer

	// life guards inst: every call holds it for reading, Close for writing.
	life   sync.RWMutex
	closed bool

	mu   sync.Mutex // guards live
	live [numKinds]map[uint64]struct{}
}

// The kinds of ids the plugin hands out.
const (
	kindAllocation = iota
	kindReservation
	kindBacking
	kindView
	numKinds
)

var kindNames = [numKinds]string{"Allocation", "Reservation", "Backing", "View"}

// New opens the plugin at path (see Open) and makes an instance of it.
func New(path string, o Options) (*Mechanism, error) {
	l, err := Open(path)
	if err != nil {
		return nil, err
	}
	return l.New(o)
}

// New makes an instance of the plugin (its open slot). It fails with a
// *LoadError of kind ErrBadDescriptor when open fails or returns no instance.
func (l *Library) New(o Options) (*Mechanism, error) {
	a := o.Authority
	if a == "" {
		if l.Device.Kind == memapi.DeviceKindHost {
			a = "host"
		} else {
			a = memapi.AuthorityID(fmt.Sprintf("%s:%d", l.Name, l.Device.Ordinal))
		}
	}
	is := memapi.NewIssuer()
	m := &Mechanism{lib: l, issuer: is, info: memapi.MechanismInfo{
		Mechanism:        l.Name,
		Instance:         is.Instance(),
		Device:           l.Device,
		Authority:        a,
		AllocGranularity: memapi.Bytes(l.desc.AllocGranularity),
		Granularity:      memapi.Bytes(l.desc.Granularity),
	}}
	for k := range m.live {
		m.live[k] = map[uint64]struct{}{}
	}
	var inst uintptr
	r, err := callC(l.desc.Open, uintptr(unsafe.Pointer(&inst)))
	if err != nil {
		return nil, &LoadError{Path: l.Path, Kind: ErrBadDescriptor, Detail: "open", Err: err}
	}
	if err := m.statusError("plugin.New", int32(r), 0); err != nil {
		return nil, &LoadError{Path: l.Path, Kind: ErrBadDescriptor, Detail: "open failed", Err: err}
	}
	if inst == 0 {
		return nil, loadErr(l.Path, ErrBadDescriptor, "open returned MEMGEN_OK and no instance")
	}
	m.inst = inst
	return m, nil
}

// Library returns the plugin the instance belongs to.
func (m *Mechanism) Library() *Library { return m.lib }

// Info describes the instance: the plugin's name, device and granularities.
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// offers reports whether the instance offers c.
func (m *Mechanism) offers(c memapi.Capability) bool { return m.lib.offers.Has(c) }

// AsVirtualBacking returns the VirtualBacking capability when the plugin has
// all its slots and the spec declares it for the plugin.
func (m *Mechanism) AsVirtualBacking() (memapi.VirtualBacking, bool) {
	if !m.offers(memapi.CapVirtualBacking) {
		return nil, false
	}
	return m, true
}

// AsSharedMapping returns the SharedMapping capability when the plugin has
// all its slots and the spec declares it for the plugin.
func (m *Mechanism) AsSharedMapping() (memapi.SharedMapping, bool) {
	if !m.offers(memapi.CapSharedMapping) {
		return nil, false
	}
	return m, true
}

// enter holds the instance open for one call; leave ends it.
func (m *Mechanism) enter(op string) error {
	m.life.RLock()
	if m.closed {
		m.life.RUnlock()
		return &memapi.Error{Op: op, Kind: memapi.ErrClosed, Mechanism: m.info.Mechanism}
	}
	return nil
}

func (m *Mechanism) leave() { m.life.RUnlock() }

// result turns a slot's raw result and the call's error into the contract's.
func (m *Mechanism) result(op string, r uintptr, err error, h memapi.HandleID) error {
	if err != nil {
		return m.protocol(op, h, "%v", err)
	}
	return m.statusError(op, int32(r), h)
}

// adopt records a new id of kind k, refusing zero and ids already live.
func (m *Mechanism) adopt(op string, k int, id uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id == 0 {
		return m.protocol(op, 0, "the plugin returned %s id 0", kindNames[k])
	}
	if _, dup := m.live[k][id]; dup {
		return m.protocol(op, 0, "the plugin returned %s id %d, which is already live", kindNames[k], id)
	}
	m.live[k][id] = struct{}{}
	return nil
}

// forget drops a released id.
func (m *Mechanism) forget(k int, id uint64) {
	m.mu.Lock()
	delete(m.live[k], id)
	m.mu.Unlock()
}

// giveBack releases through slot fn an id the plugin just created but the
// host refuses; the id is forgotten when the plugin released it, and stays
// live (visible, its bytes in UsedBytes) when it did not.
func (m *Mechanism) giveBack(k int, fn uintptr, id uint64) {
	if r, err := callC(fn, m.inst, uintptr(id)); err == nil && r == 0 {
		m.forget(k, id)
	}
}

func (m *Mechanism) noGrant(op string) error {
	return &memapi.Error{Op: op, Kind: memapi.ErrNoGrant, Mechanism: m.info.Mechanism, Detail: "a consuming call needs a grant"}
}

// idOf returns the plugin id behind a live handle of this instance.
func (m *Mechanism) idOf(op string, h memapi.Handle) (uint64, error) {
	impl, err := m.issuer.Impl(op, h)
	if err != nil {
		return 0, err
	}
	return impl.(uint64), nil
}

// Close destroys the instance (the plugin's close slot). It fails with
// ErrInUse, closing nothing, while handles of the instance are live; a
// second Close returns nil.
func (m *Mechanism) Close() error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return nil
	}
	m.mu.Lock()
	n := 0
	for k := range m.live {
		n += len(m.live[k])
	}
	m.mu.Unlock()
	if n > 0 {
		return &memapi.Error{Op: "plugin.Close", Kind: memapi.ErrInUse, Mechanism: m.info.Mechanism,
			Detail: fmt.Sprintf("%d handles are live", n)}
	}
	m.closed = true
	_, err := callC(m.lib.desc.Close, m.inst)
	if err != nil {
		return m.protocol("plugin.Close", 0, "%v", err)
	}
	return nil
}

// ---- DeviceAllocator ----------------------------------------------------

// Allocate calls the plugin's allocate slot. The grant must be present but is
// not drawn from (the checked wrapper does that).
func (m *Mechanism) Allocate(ctx context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.leave()
	in := cAllocRequest{Size: uint64(req.Size), Align: uint64(req.Align)}
	var out cAllocationOut
	r, err := callC(m.lib.da.Allocate, m.inst, uintptr(unsafe.Pointer(&in)), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, err, 0); err != nil {
		return nil, err
	}
	if err := m.adopt(op, kindAllocation, out.ID); err != nil {
		return nil, err
	}
	want, _ := memapi.RoundUp(req.Size, m.info.AllocGranularity)
	if out.Addr == 0 || out.Size < uint64(want) {
		m.giveBack(kindAllocation, m.lib.da.Free, out.ID)
		return nil, m.protocol(op, 0, "the plugin returned an allocation of %d bytes at %#x for a request of %d", out.Size, out.Addr, req.Size)
	}
	return m.issuer.NewAllocation(memapi.DeviceAddr(out.Addr), memapi.Bytes(out.Size), out.ID), nil
}

// Free calls the plugin's free slot. The account is not refunded (the
// checked wrapper does that).
func (m *Mechanism) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	const op = "DeviceAllocator.Free"
	return m.release(op, a, kindAllocation, m.lib.da.Free)
}

// release runs a releasing slot fn for handle h: the handle moves to
// releasing first, so a racing second release fails with ErrReleased, and
// back to live when the plugin refuses.
func (m *Mechanism) release(op string, h memapi.Handle, k int, fn uintptr) error {
	impl, err := m.issuer.BeginRelease(op, h)
	if err != nil {
		return err
	}
	if err := m.enter(op); err != nil {
		m.issuer.EndRelease(h, false)
		return err
	}
	defer m.leave()
	id := impl.(uint64)
	r, cerr := callC(fn, m.inst, uintptr(id))
	if err := m.result(op, r, cerr, h.ID()); err != nil {
		m.issuer.EndRelease(h, false)
		return err
	}
	m.forget(k, id)
	m.issuer.EndRelease(h, true)
	return nil
}

// UsedBytes asks the plugin's used_bytes slot; 0 after Close.
func (m *Mechanism) UsedBytes() memapi.Bytes {
	if m.enter("DeviceAllocator.UsedBytes") != nil {
		return 0
	}
	defer m.leave()
	r, err := callC(m.lib.da.UsedBytes, m.inst)
	if err != nil {
		return 0
	}
	return memapi.Bytes(r)
}

// ---- VirtualBacking -----------------------------------------------------

// Reserve calls the plugin's reserve slot.
func (m *Mechanism) Reserve(ctx context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	const op = "VirtualBacking.Reserve"
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.leave()
	in := cReserveRequest{Size: uint64(req.Size)}
	var out cReservationOut
	r, err := callC(m.lib.vb.Reserve, m.inst, uintptr(unsafe.Pointer(&in)), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, err, 0); err != nil {
		return nil, err
	}
	if err := m.adopt(op, kindReservation, out.ID); err != nil {
		return nil, err
	}
	want, _ := memapi.RoundUp(req.Size, m.info.Granularity)
	if out.Addr == 0 || out.Size < uint64(want) || out.Size%uint64(m.info.Granularity) != 0 {
		m.giveBack(kindReservation, m.lib.vb.ReleaseReservation, out.ID)
		return nil, m.protocol(op, 0, "the plugin returned a reservation of %d bytes at %#x for a request of %d", out.Size, out.Addr, req.Size)
	}
	return m.issuer.NewReservation(memapi.DeviceAddr(out.Addr), memapi.Bytes(out.Size), out.ID), nil
}

// rangeCall calls a slot taking (instance, reservation, range).
func (m *Mechanism) rangeCall(op string, fn uintptr, res *memapi.Reservation, rg memapi.Range) error {
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.leave()
	id, err := m.idOf(op, res)
	if err != nil {
		return err
	}
	in := cRange{Off: uint64(rg.Off), Len: uint64(rg.Len)}
	r, cerr := callC(fn, m.inst, uintptr(id), uintptr(unsafe.Pointer(&in)))
	return m.result(op, r, cerr, res.ID())
}

// Commit calls the plugin's commit slot. The grant must be present but is
// not drawn from (the checked wrapper does that, and in verify mode checks
// that CommittedBytes moved by exactly the range).
func (m *Mechanism) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return m.noGrant(op)
	}
	return m.rangeCall(op, m.lib.vb.Commit, res, r)
}

// Decommit calls the plugin's decommit slot.
func (m *Mechanism) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, to memapi.Account) error {
	return m.rangeCall("VirtualBacking.Decommit", m.lib.vb.Decommit, res, r)
}

// CommittedBytes calls the plugin's committed_bytes slot.
func (m *Mechanism) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	const op = "VirtualBacking.CommittedBytes"
	if err := m.enter(op); err != nil {
		return 0, err
	}
	defer m.leave()
	id, err := m.idOf(op, res)
	if err != nil {
		return 0, err
	}
	var out uint64
	r, cerr := callC(m.lib.vb.CommittedBytes, m.inst, uintptr(id), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, cerr, res.ID()); err != nil {
		return 0, err
	}
	return memapi.Bytes(out), nil
}

// ReleaseReservation calls the plugin's release_reservation slot.
func (m *Mechanism) ReleaseReservation(ctx context.Context, res *memapi.Reservation, to memapi.Account) error {
	return m.release("VirtualBacking.ReleaseReservation", res, kindReservation, m.lib.vb.ReleaseReservation)
}

// ---- SharedMapping ------------------------------------------------------

// CreateBacking calls the plugin's create_backing slot. The grant must be
// present but is not drawn from.
func (m *Mechanism) CreateBacking(ctx context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.leave()
	var out cBackingOut
	r, err := callC(m.lib.sm.CreateBacking, m.inst, uintptr(size), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, err, 0); err != nil {
		return nil, err
	}
	if err := m.adopt(op, kindBacking, out.ID); err != nil {
		return nil, err
	}
	want, _ := memapi.RoundUp(size, m.info.Granularity)
	if out.Size < uint64(want) || out.Size%uint64(m.info.Granularity) != 0 {
		m.giveBack(kindBacking, m.lib.sm.ReleaseBacking, out.ID)
		return nil, m.protocol(op, 0, "the plugin returned a backing of %d bytes for a request of %d", out.Size, size)
	}
	return m.issuer.NewBacking(memapi.Bytes(out.Size), out.ID), nil
}

// MapView calls the plugin's map_view slot.
func (m *Mechanism) MapView(ctx context.Context, res *memapi.Reservation, rg memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	if err := m.enter(op); err != nil {
		return nil, err
	}
	defer m.leave()
	rid, err := m.idOf(op, res)
	if err != nil {
		return nil, err
	}
	bid, err := m.idOf(op, b)
	if err != nil {
		return nil, err
	}
	in := cRange{Off: uint64(rg.Off), Len: uint64(rg.Len)}
	var out cViewOut
	r, cerr := callC(m.lib.sm.MapView, m.inst, uintptr(rid), uintptr(unsafe.Pointer(&in)), uintptr(bid), uintptr(access), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, cerr, res.ID()); err != nil {
		return nil, err
	}
	if err := m.adopt(op, kindView, out.ID); err != nil {
		return nil, err
	}
	if out.Reservation != rid || out.Backing != bid || out.Range != in || out.Access != int32(access) {
		m.giveBack(kindView, m.lib.sm.UnmapView, out.ID)
		return nil, m.protocol(op, res.ID(), "the plugin mapped %+v, asked for reservation %d, backing %d, range %+v, access %d", out, rid, bid, in, access)
	}
	return m.issuer.NewView(res, rg, b, access, out.ID), nil
}

// UnmapView calls the plugin's unmap_view slot.
func (m *Mechanism) UnmapView(ctx context.Context, v *memapi.View) error {
	return m.release("SharedMapping.UnmapView", v, kindView, m.lib.sm.UnmapView)
}

// CopyOnWrite calls the plugin's copy_on_write slot (ABI 1.1; a plugin of
// 1.0 has no SharedMapping here). v is released and a view of a new backing
// returned; the grant must be present but is not drawn from.
func (m *Mechanism) CopyOnWrite(ctx context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	impl, err := m.issuer.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	if err := m.enter(op); err != nil {
		m.issuer.EndRelease(v, false)
		return nil, err
	}
	defer m.leave()
	old := impl.(uint64)
	res := v.Reservation()
	rid, _ := m.idOf(op, res) // live: v keeps it
	var out cViewOut
	r, cerr := callC(m.lib.sm.CopyOnWrite, m.inst, uintptr(old), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, cerr, v.ID()); err != nil {
		m.issuer.EndRelease(v, false)
		return nil, err
	}
	// The plugin replaced v: its id is dead (and may be reused at once).
	m.forget(kindView, old)
	m.issuer.EndRelease(v, true)
	rg := v.Range()
	if err := m.adopt(op, kindView, out.ID); err != nil {
		return nil, err
	}
	if err := m.adopt(op, kindBacking, out.Backing); err != nil {
		return nil, err
	}
	if out.Reservation != rid || out.Range != (cRange{Off: uint64(rg.Off), Len: uint64(rg.Len)}) || out.Access != int32(memapi.AccessReadWrite) {
		return nil, m.protocol(op, v.ID(), "the plugin's copy %+v is not a read-write view of range %v of reservation %d", out, rg, rid)
	}
	nb := m.issuer.NewBacking(rg.Len, out.Backing)
	return m.issuer.NewView(res, rg, nb, memapi.AccessReadWrite, out.ID), nil
}

// ViewCount calls the plugin's view_count slot.
func (m *Mechanism) ViewCount(b *memapi.Backing) (int, error) {
	const op = "SharedMapping.ViewCount"
	if err := m.enter(op); err != nil {
		return 0, err
	}
	defer m.leave()
	id, err := m.idOf(op, b)
	if err != nil {
		return 0, err
	}
	var out int64
	r, cerr := callC(m.lib.sm.ViewCount, m.inst, uintptr(id), uintptr(unsafe.Pointer(&out)))
	if err := m.result(op, r, cerr, b.ID()); err != nil {
		return 0, err
	}
	return int(out), nil
}

// ReleaseBacking calls the plugin's release_backing slot.
func (m *Mechanism) ReleaseBacking(ctx context.Context, b *memapi.Backing, to memapi.Account) error {
	return m.release("SharedMapping.ReleaseBacking", b, kindBacking, m.lib.sm.ReleaseBacking)
}
