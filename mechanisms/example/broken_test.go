package example

import (
	"context"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Deliberately broken mechanisms. Each embeds the honest in-memory Mechanism
// and breaks one rule of the spec; the meta-tests check that the suite
// fails the subtest meant to catch it.

// noopCommit: Commit validates its arguments and reports success, but
// installs nothing (the lying eager allocator).
type noopCommit struct{ *Mechanism }

func (b noopCommit) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b noopCommit) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	if err := b.Mechanism.Commit(ctx, res, r, grant); err != nil {
		return err
	}
	return b.Mechanism.Decommit(ctx, res, r, nil)
}

// hollowCommit: Commit moves every counter as an honest one would
// (CommittedBytes, UsedBytes, and so the checked wrapper's verify mode) but
// installs nothing; Decommit and ReleaseReservation take the hollow bytes
// back. Only reading the memory through the device context shows the lie.
type hollowCommit struct {
	*Mechanism
	mu     sync.Mutex
	hollow map[*memapi.Reservation]memapi.Bytes
}

func newHollowCommit(m *Mechanism) *hollowCommit {
	return &hollowCommit{Mechanism: m, hollow: map[*memapi.Reservation]memapi.Bytes{}}
}

func (b *hollowCommit) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b *hollowCommit) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	// Every check of the honest Commit, then nothing installed.
	if err := b.Mechanism.Commit(ctx, res, r, grant); err != nil {
		return err
	}
	if err := b.Mechanism.Decommit(ctx, res, r, nil); err != nil {
		return err
	}
	b.mu.Lock()
	b.hollow[res] += r.Len
	b.mu.Unlock()
	return nil
}

func (b *hollowCommit) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, to memapi.Account) error {
	b.mu.Lock()
	if b.hollow[res] >= r.Len {
		b.hollow[res] -= r.Len
		b.mu.Unlock()
		return nil
	}
	b.mu.Unlock()
	return b.Mechanism.Decommit(ctx, res, r, to)
}

func (b *hollowCommit) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	n, err := b.Mechanism.CommittedBytes(res)
	b.mu.Lock()
	defer b.mu.Unlock()
	return n + b.hollow[res], err
}

func (b *hollowCommit) UsedBytes() memapi.Bytes {
	b.mu.Lock()
	var n memapi.Bytes
	for _, h := range b.hollow {
		n += h
	}
	b.mu.Unlock()
	return b.Mechanism.UsedBytes() + n
}

func (b *hollowCommit) ReleaseReservation(ctx context.Context, res *memapi.Reservation, to memapi.Account) error {
	err := b.Mechanism.ReleaseReservation(ctx, res, to)
	if err == nil {
		b.mu.Lock()
		delete(b.hollow, res)
		b.mu.Unlock()
	}
	return err
}

// foreignFree: Free of an allocation made by another instance reports success.
type foreignFree struct{ *Mechanism }

func (b foreignFree) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	if a != nil && a.Creator() != b.info.Instance {
		return nil
	}
	return b.Mechanism.Free(ctx, a, to)
}

// ignoresGranularity: an unaligned Commit commits the granules around it.
type ignoresGranularity struct{ *Mechanism }

func (b ignoresGranularity) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b ignoresGranularity) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	g := b.info.Granularity
	start := r.Off / g * g
	end, _ := memapi.RoundUp(r.Off+r.Len, g)
	return b.Mechanism.Commit(ctx, res, memapi.Range{Off: start, Len: end - start}, grant)
}

// misreportsCommitted: CommittedBytes adds a granule whenever anything is committed.
type misreportsCommitted struct{ *Mechanism }

func (b misreportsCommitted) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b misreportsCommitted) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	n, err := b.Mechanism.CommittedBytes(res)
	if n > 0 {
		n += b.info.Granularity
	}
	return n, err
}

// claimsUnsupported: AsSharedMapping says yes, every method says unsupported.
type claimsUnsupported struct{ *Mechanism }

func (b claimsUnsupported) AsSharedMapping() (memapi.SharedMapping, bool) {
	return unsupportedSharing{}, true
}

type unsupportedSharing struct{}

func unsupported(op string) error {
	return memapi.Errorf("SharedMapping."+op, memapi.ErrUnsupported, "not implemented")
}

func (unsupportedSharing) CreateBacking(context.Context, memapi.Bytes, memapi.Grant) (*memapi.Backing, error) {
	return nil, unsupported("CreateBacking")
}

func (unsupportedSharing) MapView(context.Context, *memapi.Reservation, memapi.Range, *memapi.Backing, memapi.Access) (*memapi.View, error) {
	return nil, unsupported("MapView")
}

func (unsupportedSharing) UnmapView(context.Context, *memapi.View) error {
	return unsupported("UnmapView")
}

func (unsupportedSharing) CopyOnWrite(context.Context, *memapi.View, memapi.Grant) (*memapi.View, error) {
	return nil, unsupported("CopyOnWrite")
}

func (unsupportedSharing) ViewCount(*memapi.Backing) (int, error) { return 0, unsupported("ViewCount") }

func (unsupportedSharing) ReleaseBacking(context.Context, *memapi.Backing, memapi.Account) error {
	return unsupported("ReleaseBacking")
}

// leakyFree: Free releases the handle but UsedBytes keeps counting it.
type leakyFree struct{ *Mechanism }

func (b leakyFree) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	if err := b.Mechanism.Free(ctx, a, to); err != nil {
		return err
	}
	b.mu.Lock()
	b.used += a.Size()
	b.mu.Unlock()
	return nil
}

// doubleFree: a second Free of the same allocation reports success.
type doubleFree struct{ *Mechanism }

func (b doubleFree) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	if a != nil && a.Creator() == b.info.Instance && !a.Live() {
		return nil
	}
	return b.Mechanism.Free(ctx, a, to)
}

// writableReadOnly: read-only views accept writes.
type writableReadOnly struct{ *Mechanism }

func (b writableReadOnly) AsSharedMapping() (memapi.SharedMapping, bool) { return b, true }

func (b writableReadOnly) MapView(ctx context.Context, res *memapi.Reservation, r memapi.Range, bk *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	v, err := b.Mechanism.MapView(ctx, res, r, bk, access)
	if err == nil {
		b.mu.Lock()
		b.areas[res.Addr()].(*reservation).slots[r.Off/b.info.Granularity].view.access = memapi.AccessReadWrite
		b.mu.Unlock()
	}
	return v, err
}

// sharedCopyOnWrite: CopyOnWrite remaps the same backing read-write: no
// private copy, nothing charged.
type sharedCopyOnWrite struct{ *Mechanism }

func (b sharedCopyOnWrite) AsSharedMapping() (memapi.SharedMapping, bool) { return b, true }

func (b sharedCopyOnWrite) CopyOnWrite(ctx context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	if grant == nil {
		return nil, memapi.Errorf("SharedMapping.CopyOnWrite", memapi.ErrNoGrant, "no grant")
	}
	if err := b.Mechanism.UnmapView(ctx, v); err != nil {
		return nil, err
	}
	return b.Mechanism.MapView(ctx, v.Reservation(), v.Range(), v.Backing(), memapi.AccessReadWrite)
}

// dirtyRecommit: decommitted granules keep their bytes and a later Commit
// hands them out again instead of fresh zeros.
type dirtyRecommit struct {
	*Mechanism
	kept map[memapi.DeviceAddr][]byte
}

func (b dirtyRecommit) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b dirtyRecommit) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, to memapi.Account) error {
	b.mu.Lock()
	var saved [][]byte
	if res != nil && res.Live() {
		if rs, ok := b.areas[res.Addr()].(*reservation); ok {
			g := b.info.Granularity
			for i := r.Off / g; i < (r.Off+r.Len)/g && int(i) < len(rs.slots); i++ {
				saved = append(saved, rs.slots[i].data)
			}
		}
	}
	b.mu.Unlock()
	if err := b.Mechanism.Decommit(ctx, res, r, to); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, d := range saved {
		b.kept[res.Addr()+memapi.DeviceAddr(r.Off)+memapi.DeviceAddr(memapi.Bytes(i)*b.info.Granularity)] = d
	}
	return nil
}

func (b dirtyRecommit) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	if err := b.Mechanism.Commit(ctx, res, r, grant); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rs := b.areas[res.Addr()].(*reservation)
	g := b.info.Granularity
	for i := r.Off / g; i < (r.Off+r.Len)/g; i++ {
		if d, ok := b.kept[res.Addr()+memapi.DeviceAddr(i*g)]; ok {
			rs.slots[i].data = d
		}
	}
	return nil
}

// releaseInUse: ReleaseBacking of a backing with mapped views reports
// success and keeps it.
type releaseInUse struct{ *Mechanism }

func (b releaseInUse) AsSharedMapping() (memapi.SharedMapping, bool) { return b, true }

func (b releaseInUse) ReleaseBacking(ctx context.Context, bk *memapi.Backing, to memapi.Account) error {
	if n, err := b.Mechanism.ViewCount(bk); err == nil && n > 0 {
		return nil
	}
	return b.Mechanism.ReleaseBacking(ctx, bk, to)
}

// partialCommit: a Commit overlapping committed granules installs the free
// ones before it fails with ErrCommitted.
type partialCommit struct{ *Mechanism }

func (b partialCommit) AsVirtualBacking() (memapi.VirtualBacking, bool) { return b, true }

func (b partialCommit) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	g := b.info.Granularity
	if res == nil || !res.Live() || !r.Aligned(g) || !r.Within(res.Size()) || grant == nil {
		return b.Mechanism.Commit(ctx, res, r, grant)
	}
	var first error
	for off := r.Off; off < r.Off+r.Len; off += g {
		if err := b.Mechanism.Commit(ctx, res, memapi.Range{Off: off, Len: g}, grant); err != nil && first == nil {
			first = err
		}
	}
	return first
}
