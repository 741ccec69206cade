package fakestest

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

func TestAllocateRoundTripAndRounding(t *testing.T) {
	m, c, g, acct := newFake(t, fakes.Config{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 5000}, g)
	ok(t, err)
	if a.Size() != 8192 {
		t.Fatalf("Size = %d, want 8192 (5000 rounded to the 4 KiB allocation granularity)", a.Size())
	}
	used(t, m, 8192)
	if a.Creator() != m.Info().Instance {
		t.Fatalf("creator %d, want instance %d", a.Creator(), m.Info().Instance)
	}
	p := pattern(8192, 3)
	mustWrite(t, c, a.Addr(), p)
	eq(t, mustRead(t, c, a.Addr(), 8192), p)
	// A copy past the end fails and changes nothing.
	is(t, write(t, c, a.Addr()+4096, make([]byte, 8192)), memapi.ErrInvalidRange)
	eq(t, mustRead(t, c, a.Addr(), 8192), p)

	ok(t, m.Free(bg, a, acct))
	used(t, m, 0)
	is(t, m.Free(bg, a, acct), memapi.ErrReleased)
	_, err = read(t, c, a.Addr(), 1)
	is(t, err, memapi.ErrInvalidRange)
	if m.LiveHandles() != 0 {
		t.Fatalf("LiveHandles = %d after Free", m.LiveHandles())
	}
	// The bare fake moves no ledger bytes: that is the checked wrapper's job.
	if g.Drawn() != 0 || acct.Refunded() != 0 {
		t.Fatalf("bare fake moved the ledger: drawn %d refunded %d", g.Drawn(), acct.Refunded())
	}
}

func TestAllocateAlignmentAndAddresses(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{})
	seen := map[memapi.DeviceAddr]bool{}
	for i := 0; i < 8; i++ {
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 100, Align: 1 << 20}, g)
		ok(t, err)
		if a.Addr()%(1<<20) != 0 {
			t.Fatalf("address %#x is not aligned to 1 MiB", a.Addr())
		}
		if seen[a.Addr()] {
			t.Fatalf("address %#x reused", a.Addr())
		}
		seen[a.Addr()] = true
		ok(t, m.Free(bg, a, acct))
	}
	_, err := m.Allocate(bg, memapi.AllocRequest{Size: 100, Align: 3}, g)
	is(t, err, memapi.ErrInvalidSize)
}

func TestAllocateErrors(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{Capacity: 16 * kib})
	other := fakes.NewMechanism(fakes.Config{})
	foreign, err := other.Allocate(bg, memapi.AllocRequest{Size: 1}, g)
	ok(t, err)

	_, err = m.Allocate(bg, memapi.AllocRequest{Size: 1}, nil)
	is(t, err, memapi.ErrNoGrant)
	_, err = m.Allocate(bg, memapi.AllocRequest{Size: 0}, g)
	is(t, err, memapi.ErrInvalidSize)
	_, err = m.Allocate(bg, memapi.AllocRequest{Size: ^memapi.Bytes(0)}, g)
	is(t, err, memapi.ErrInvalidSize)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 12 * kib}, g)
	ok(t, err)
	_, err = m.Allocate(bg, memapi.AllocRequest{Size: 8 * kib}, g)
	is(t, err, memapi.ErrOutOfMemory)
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != 8*kib || me.Available != 4*kib || me.Op != "DeviceAllocator.Allocate" {
		t.Fatalf("out-of-memory error lacks its figures: %#v", me)
	}
	used(t, m, 12*kib)

	is(t, m.Free(bg, nil, acct), memapi.ErrNilHandle)
	is(t, m.Free(bg, foreign, acct), memapi.ErrForeignHandle)
	if !foreign.Live() {
		t.Fatal("a foreign Free released the handle")
	}
	ok(t, m.Free(bg, a, acct))
	ok(t, other.Free(bg, foreign, acct))
}

func TestReserveCommitDecommit(t *testing.T) {
	m, c, g, acct := newFake(t, fakes.Config{})
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 3*g64 + 1})
	ok(t, err)
	if res.Size() != 4*g64 {
		t.Fatalf("reservation size %d, want %d", res.Size(), 4*g64)
	}
	used(t, m, 0)
	committed(t, m, res, 0)

	// Nothing is backed yet.
	_, err = read(t, c, res.Addr(), 1)
	is(t, err, memapi.ErrNotCommitted)

	ok(t, m.Commit(bg, res, memapi.Range{Off: g64, Len: 2 * g64}, g))
	committed(t, m, res, 2*g64)
	used(t, m, 2*g64)
	eq(t, mustRead(t, c, res.Addr()+g64, 2*g64), make([]byte, 2*g64)) // fresh backing reads as zeros

	// A write spanning both committed granules works; one that touches an
	// uncommitted granule fails and changes nothing.
	p := pattern(2*g64, 9)
	mustWrite(t, c, res.Addr()+g64, p)
	is(t, write(t, c, res.Addr()+g64, make([]byte, 3*g64)), memapi.ErrNotCommitted)
	eq(t, mustRead(t, c, res.Addr()+g64, 2*g64), p)

	for _, tc := range []struct {
		name string
		r    memapi.Range
		want error
	}{
		{"empty", memapi.Range{Off: 0, Len: 0}, memapi.ErrInvalidRange},
		{"outside", memapi.Range{Off: 4 * g64, Len: g64}, memapi.ErrInvalidRange},
		{"overflow", memapi.Range{Off: ^memapi.Bytes(0) - g64 + 1, Len: g64}, memapi.ErrInvalidRange},
		{"unaligned-off", memapi.Range{Off: 4096, Len: g64}, memapi.ErrUnaligned},
		{"unaligned-len", memapi.Range{Off: 0, Len: 4096}, memapi.ErrUnaligned},
		{"overlaps-committed", memapi.Range{Off: 0, Len: 2 * g64}, memapi.ErrCommitted},
	} {
		t.Run("commit/"+tc.name, func(t *testing.T) {
			is(t, m.Commit(bg, res, tc.r, g), tc.want)
			committed(t, m, res, 2*g64)
			used(t, m, 2*g64)
		})
	}
	is(t, m.Commit(bg, res, memapi.Range{Off: 0, Len: g64}, nil), memapi.ErrNoGrant)
	is(t, m.Decommit(bg, res, memapi.Range{Off: 0, Len: 2 * g64}, acct), memapi.ErrNotCommitted)
	committed(t, m, res, 2*g64)

	ok(t, m.Decommit(bg, res, memapi.Range{Off: g64, Len: g64}, acct))
	committed(t, m, res, g64)
	used(t, m, g64)
	// Decommitted bytes are gone: committing again reads zeros.
	ok(t, m.Commit(bg, res, memapi.Range{Off: g64, Len: g64}, g))
	eq(t, mustRead(t, c, res.Addr()+g64, g64), make([]byte, g64))
	eq(t, mustRead(t, c, res.Addr()+2*g64, g64), p[g64:])

	ok(t, m.ReleaseReservation(bg, res, acct))
	used(t, m, 0)
	_, err = m.CommittedBytes(res)
	is(t, err, memapi.ErrReleased)
	is(t, m.ReleaseReservation(bg, res, acct), memapi.ErrReleased)
	is(t, m.Commit(bg, res, memapi.Range{Off: 0, Len: g64}, g), memapi.ErrReleased)
}

func TestCommitOutOfMemoryLeavesNothing(t *testing.T) {
	m, _, g, _ := newFake(t, fakes.Config{Capacity: 2 * g64})
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g64})
	ok(t, err)
	ok(t, m.Commit(bg, res, memapi.Range{Off: 0, Len: g64}, g))
	is(t, m.Commit(bg, res, memapi.Range{Off: g64, Len: 2 * g64}, g), memapi.ErrOutOfMemory)
	committed(t, m, res, g64)
	used(t, m, g64)
	// The granule that would have fitted was not installed either.
	ok(t, m.Commit(bg, res, memapi.Range{Off: g64, Len: g64}, g))
}

func TestSharedViewsSeeTheSameBytes(t *testing.T) {
	m, c, g, acct := newFake(t, fakes.Config{})
	b, err := m.CreateBacking(bg, g64+1, g)
	ok(t, err)
	if b.Size() != 2*g64 {
		t.Fatalf("backing size %d, want %d", b.Size(), 2*g64)
	}
	used(t, m, 2*g64)
	r1, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g64})
	ok(t, err)
	r2, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g64})
	ok(t, err)
	rw, err := m.MapView(bg, r1, memapi.Range{Off: 2 * g64, Len: 2 * g64}, b, memapi.AccessReadWrite)
	ok(t, err)
	ro, err := m.MapView(bg, r2, memapi.Range{Off: 0, Len: 2 * g64}, b, memapi.AccessReadOnly)
	ok(t, err)
	used(t, m, 2*g64) // views add nothing
	committed(t, m, r1, 0)
	if n, err := m.ViewCount(b); err != nil || n != 2 {
		t.Fatalf("ViewCount = %d, %v; want 2", n, err)
	}

	p := pattern(2*g64, 1)
	mustWrite(t, c, r1.Addr()+2*g64, p)
	eq(t, mustRead(t, c, r2.Addr(), 2*g64), p)

	// Read-only refuses writes through the context and nothing changes.
	is(t, write(t, c, r2.Addr()+10, []byte{1, 2, 3}), memapi.ErrReadOnly)
	eq(t, mustRead(t, c, r1.Addr()+2*g64, 2*g64), p)
	is(t, m.WriteMemory(r2.Addr(), []byte{1}), memapi.ErrReadOnly)

	// Device-to-device copies read through read-only views and write through read-write ones.
	s := stream(t, c)
	ok(t, m.Commit(bg, r2, memapi.Range{Off: 2 * g64, Len: g64}, g))
	ok(t, s.CopyDevice(r2.Addr()+2*g64, r2.Addr(), g64))
	ok(t, s.Synchronize(bg))
	eq(t, mustRead(t, c, r2.Addr()+2*g64, g64), p[:g64])
	ok(t, s.CopyDevice(r2.Addr(), r2.Addr()+2*g64, 16))
	is(t, s.Synchronize(bg), memapi.ErrReadOnly)

	// Mapping errors.
	_, err = m.MapView(bg, r1, memapi.Range{Off: 2 * g64, Len: 2 * g64}, b, memapi.AccessReadOnly)
	is(t, err, memapi.ErrCommitted)
	_, err = m.MapView(bg, r2, memapi.Range{Off: 2 * g64, Len: 2 * g64}, b, memapi.AccessReadOnly)
	is(t, err, memapi.ErrCommitted) // over a committed granule
	_, err = m.MapView(bg, r1, memapi.Range{Off: 0, Len: g64}, b, memapi.AccessReadOnly)
	is(t, err, memapi.ErrInvalidSize) // not as long as the backing
	_, err = m.MapView(bg, r1, memapi.Range{Off: 3 * g64, Len: 2 * g64}, b, memapi.AccessReadOnly)
	is(t, err, memapi.ErrInvalidRange)
	_, err = m.MapView(bg, r1, memapi.Range{Off: 4096, Len: 2 * g64}, b, memapi.AccessReadOnly)
	is(t, err, memapi.ErrUnaligned)
	is(t, m.Decommit(bg, r1, memapi.Range{Off: 2 * g64, Len: g64}, acct), memapi.ErrNotCommitted) // views are not commits

	// Dependants keep handles alive.
	is(t, m.ReleaseBacking(bg, b, acct), memapi.ErrInUse)
	is(t, m.ReleaseReservation(bg, r1, acct), memapi.ErrInUse)
	if !b.Live() || !r1.Live() {
		t.Fatal("a refused release retired the handle")
	}
	ok(t, m.UnmapView(bg, rw))
	is(t, m.UnmapView(bg, rw), memapi.ErrReleased)
	_, err = read(t, c, r1.Addr()+2*g64, 1)
	is(t, err, memapi.ErrNotCommitted)
	ok(t, m.ReleaseReservation(bg, r1, acct))
	eq(t, mustRead(t, c, r2.Addr(), 2*g64), p) // the backing lives on
	ok(t, m.UnmapView(bg, ro))
	if n, err := m.ViewCount(b); err != nil || n != 0 {
		t.Fatalf("ViewCount = %d, %v; want 0", n, err)
	}
	ok(t, m.ReleaseBacking(bg, b, acct))
	ok(t, m.ReleaseReservation(bg, r2, acct))
	used(t, m, 0)
	if m.LiveHandles() != 0 {
		t.Fatalf("LiveHandles = %d", m.LiveHandles())
	}
}

func TestCopyOnWriteGivesAPrivateCopy(t *testing.T) {
	m, c, g, acct := newFake(t, fakes.Config{})
	b, err := m.CreateBacking(bg, g64, g)
	ok(t, err)
	r, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * g64})
	ok(t, err)
	v1, err := m.MapView(bg, r, memapi.Range{Off: 0, Len: g64}, b, memapi.AccessReadWrite)
	ok(t, err)
	v2, err := m.MapView(bg, r, memapi.Range{Off: g64, Len: g64}, b, memapi.AccessReadOnly)
	ok(t, err)
	p := pattern(g64, 5)
	mustWrite(t, c, r.Addr(), p)

	_, err = m.CopyOnWrite(bg, v2, nil)
	is(t, err, memapi.ErrNoGrant)
	cow, err := m.CopyOnWrite(bg, v2, g)
	ok(t, err)
	if v2.Live() || !cow.Live() || cow.Access() != memapi.AccessReadWrite || cow.Range() != v2.Range() || cow.Backing() == b {
		t.Fatalf("CopyOnWrite result: old live %v, new live %v, access %v, range %v, same backing %v",
			v2.Live(), cow.Live(), cow.Access(), cow.Range(), cow.Backing() == b)
	}
	used(t, m, 2*g64)
	if n, _ := m.ViewCount(b); n != 1 {
		t.Fatalf("old backing ViewCount = %d, want 1", n)
	}
	if n, _ := m.ViewCount(cow.Backing()); n != 1 {
		t.Fatalf("new backing ViewCount = %d, want 1", n)
	}
	eq(t, mustRead(t, c, r.Addr()+g64, g64), p)
	q := pattern(g64, 77)
	mustWrite(t, c, r.Addr()+g64, q)
	eq(t, mustRead(t, c, r.Addr(), g64), p) // the shared page is untouched
	eq(t, mustRead(t, c, r.Addr()+g64, g64), q)

	is(t, m.UnmapView(bg, v2), memapi.ErrReleased)
	_, err = m.CopyOnWrite(bg, v2, g)
	is(t, err, memapi.ErrReleased)

	ok(t, m.UnmapView(bg, cow))
	ok(t, m.ReleaseBacking(bg, cow.Backing(), acct))
	ok(t, m.UnmapView(bg, v1))
	ok(t, m.ReleaseBacking(bg, b, acct))
	ok(t, m.ReleaseReservation(bg, r, acct))
	used(t, m, 0)
}

func TestCopyOnWriteOutOfMemoryKeepsTheView(t *testing.T) {
	m, _, g, _ := newFake(t, fakes.Config{Capacity: g64})
	b, err := m.CreateBacking(bg, g64, g)
	ok(t, err)
	r, err := m.Reserve(bg, memapi.ReserveRequest{Size: g64})
	ok(t, err)
	v, err := m.MapView(bg, r, memapi.Range{Len: g64}, b, memapi.AccessReadOnly)
	ok(t, err)
	_, err = m.CopyOnWrite(bg, v, g)
	is(t, err, memapi.ErrOutOfMemory)
	if !v.Live() {
		t.Fatal("a failed CopyOnWrite released the view")
	}
	used(t, m, g64)
}

func TestOffersSubset(t *testing.T) {
	m, _, g, _ := newFake(t, fakes.Config{Offers: memapi.Of(memapi.CapVirtualBacking)})
	if got, want := memapi.Negotiate(m), memapi.Of(memapi.CapDeviceAllocator, memapi.CapVirtualBacking); got != want {
		t.Fatalf("Negotiate = %v, want %v", got, want)
	}
	if sm, has := m.AsSharedMapping(); has || sm != nil {
		t.Fatal("AsSharedMapping reports a capability the fake was configured without")
	}
	_, err := memapi.RequireSharedMapping(m)
	is(t, err, errors.ErrUnsupported)
	// Calling the method directly does not silently succeed either.
	_, err = m.CreateBacking(bg, g64, g)
	is(t, err, memapi.ErrUnsupported)
	used(t, m, 0)
	if _, err := memapi.RequireVirtualBacking(m); err != nil {
		t.Fatalf("RequireVirtualBacking: %v", err)
	}
}

func TestLyingEager(t *testing.T) {
	m, c, g, acct := newFake(t, fakes.Config{LyingEager: true})
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g64})
	ok(t, err)
	used(t, m, 4*g64) // the eager allocator took it all at once
	ok(t, m.Commit(bg, res, memapi.Range{Off: 0, Len: g64}, g))
	committed(t, m, res, 0) // the lie: success, and nothing moved
	used(t, m, 4*g64)
	// Memory is there without commits, as with an eager allocator.
	p := pattern(64, 2)
	mustWrite(t, c, res.Addr()+3*g64, p)
	eq(t, mustRead(t, c, res.Addr()+3*g64, 64), p)
	// Arguments are still checked.
	is(t, m.Commit(bg, res, memapi.Range{Off: 4096, Len: g64}, g), memapi.ErrUnaligned)
	ok(t, m.ReleaseReservation(bg, res, acct))
	used(t, m, 0)

	small, _, _, _ := newFake(t, fakes.Config{LyingEager: true, Capacity: g64})
	_, err = small.Reserve(bg, memapi.ReserveRequest{Size: 2 * g64})
	is(t, err, memapi.ErrOutOfMemory)
}

func TestGranularityConfig(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{AllocGranularity: 512, Granularity: 2 << 20})
	info := m.Info()
	if info.AllocGranularity != 512 || info.Granularity != 2<<20 || info.Mechanism != "fake" || info.Authority != "fake" || info.Device.Kind != memapi.DeviceKindHost {
		t.Fatalf("Info = %+v", info)
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 513}, g)
	ok(t, err)
	if a.Size() != 1024 {
		t.Fatalf("Size = %d, want 1024", a.Size())
	}
	ok(t, m.Free(bg, a, acct))
	defer func() {
		if recover() == nil {
			t.Fatal("a granularity that is not a power of two was accepted")
		}
	}()
	fakes.NewMechanism(fakes.Config{Granularity: 3000})
}

func TestReadWriteMemory(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 10}, g)
	ok(t, err)
	ok(t, m.WriteMemory(a.Addr()+1, []byte("hello")))
	eq(t, mustRead(t, c, a.Addr(), 7), []byte("\x00hello\x00"))
	p := make([]byte, 5)
	ok(t, m.ReadMemory(a.Addr()+1, p))
	eq(t, p, []byte("hello"))
	is(t, m.ReadMemory(a.Addr()+4093, p), memapi.ErrInvalidRange)
	is(t, m.ReadMemory(1, p), memapi.ErrInvalidRange)
}
