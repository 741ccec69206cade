package cpu

import (
	"bytes"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

func TestSharedViews(t *testing.T) {
	granularities(t, func(t *testing.T, gran memapi.Bytes) {
		m := newMech(t, gran)
		s := newStream(t, m)
		size := 2 * gran
		b, err := m.CreateBacking(bg, size-1, g)
		if err != nil {
			t.Fatal(err)
		}
		if b.Size() != size || m.UsedBytes() != size {
			t.Fatalf("backing size %d, used %d, want %d", b.Size(), m.UsedBytes(), size)
		}
		// Charged at creation: the memfd's allocated blocks are its size.
		if n := backingBlocks(t, m, b); n != size {
			t.Fatalf("memfd has %d bytes allocated, want %d", n, size)
		}
		checkKernel(t, m)

		// Two reservations; views of b at several places in them.
		r1, err := m.Reserve(bg, memapi.ReserveRequest{Size: 3 * size})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := m.Reserve(bg, memapi.ReserveRequest{Size: size})
		if err != nil {
			t.Fatal(err)
		}
		mapView := func(res *memapi.Reservation, off memapi.Bytes, a memapi.Access) *memapi.View {
			t.Helper()
			v, err := m.MapView(bg, res, memapi.Range{Off: off, Len: size}, b, a)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		writer := mapView(r1, 0, memapi.AccessReadWrite)
		ro1 := mapView(r1, 2*size, memapi.AccessReadOnly)
		ro2 := mapView(r2, 0, memapi.AccessReadOnly)
		addr := func(v *memapi.View) memapi.DeviceAddr {
			return v.Reservation().Addr() + memapi.DeviceAddr(v.Range().Off)
		}
		if n, _ := m.ViewCount(b); n != 3 {
			t.Fatalf("ViewCount = %d, want 3", n)
		}
		// Views add nothing: the backing is counted once.
		if m.UsedBytes() != size {
			t.Fatalf("UsedBytes = %d with three views, want %d", m.UsedBytes(), size)
		}
		checkKernel(t, m)
		if c, _ := m.CommittedBytes(r1); c != 0 {
			t.Fatalf("views count as committed bytes: %d", c)
		}
		if got := read(t, s, addr(ro1), size); !allZero(got) {
			t.Fatal("a fresh backing does not read zeros")
		}

		data := pattern(size, 3)
		if err := write(s, addr(writer), data); err != nil {
			t.Fatal(err)
		}
		for _, v := range []*memapi.View{ro1, ro2} {
			if got := read(t, s, addr(v), size); !bytes.Equal(got, data) {
				t.Fatal("a view does not see the bytes written through another")
			}
		}
		// fallocate allocated (and charged) every page, which fstat reports;
		// mincore reports a shmem page once it is up to date (written), and
		// then for every view of it.
		for _, v := range []*memapi.View{writer, ro1, ro2} {
			if r := residentAt(t, m, addr(v), size); r != size {
				t.Fatalf("mincore over a view reports %d, want the backing's %d", r, size)
			}
		}
		if n := backingBlocks(t, m, b); n != size {
			t.Fatalf("memfd has %d bytes allocated after the write, want %d", n, size)
		}
		checkKernel(t, m)
		// A copy into a read-only view fails and changes nothing.
		wantKind(t, write(s, addr(ro1), pattern(size, 4)), memapi.ErrReadOnly)
		wantKind(t, write(s, addr(ro2)+memapi.DeviceAddr(size-1), []byte{0}), memapi.ErrReadOnly)
		if got := read(t, s, addr(ro2), size); !bytes.Equal(got, data) {
			t.Fatal("a refused write into a read-only view changed the bytes")
		}
		// A copy spanning a read-write view and a read-only one fails as a whole.
		mid := mapView(r1, size, memapi.AccessReadOnly)
		wantKind(t, write(s, addr(writer)+memapi.DeviceAddr(size-1), []byte{9, 9}), memapi.ErrReadOnly)
		if got := read(t, s, addr(writer), size); !bytes.Equal(got, data) {
			t.Fatal("a refused spanning write changed the bytes")
		}

		// Copy-on-write: a private, charged, read-write copy in place.
		cow, err := m.CopyOnWrite(bg, ro2, g)
		if err != nil {
			t.Fatal(err)
		}
		if ro2.Live() || !cow.Live() || cow.Access() != memapi.AccessReadWrite || addr(cow) != addr(ro2) || cow.Backing() == b {
			t.Fatalf("CopyOnWrite returned %v (access %v) for %v", cow, cow.Access(), ro2)
		}
		if m.UsedBytes() != 2*size {
			t.Fatalf("UsedBytes = %d after CopyOnWrite, want %d", m.UsedBytes(), 2*size)
		}
		checkKernel(t, m)
		if n, _ := m.ViewCount(b); n != 3 {
			t.Fatalf("ViewCount(b) = %d after CopyOnWrite, want 3", n)
		}
		if got := read(t, s, addr(cow), size); !bytes.Equal(got, data) {
			t.Fatal("the copy does not hold the view's bytes")
		}
		mine := pattern(size, 5)
		if err := write(s, addr(cow), mine); err != nil {
			t.Fatal(err)
		}
		if got := read(t, s, addr(ro1), size); !bytes.Equal(got, data) {
			t.Fatal("a write into the copy-on-write view is visible to the shared views")
		}
		if got := read(t, s, addr(cow), size); !bytes.Equal(got, mine) {
			t.Fatal("the copy-on-write view lost its write")
		}
		wantKind(t, m.UnmapView(bg, ro2), memapi.ErrReleased)

		// Releases while views are mapped fail and change nothing.
		wantKind(t, m.ReleaseBacking(bg, b, g), memapi.ErrInUse)
		wantKind(t, m.ReleaseReservation(bg, r1, g), memapi.ErrInUse)
		wantKind(t, m.ReleaseReservation(bg, r2, g), memapi.ErrInUse)
		if !b.Live() || !r1.Live() || !r2.Live() || m.UsedBytes() != 2*size {
			t.Fatal("a refused release changed state")
		}
		// Unmapping leaves reserved space, never a hole.
		for _, v := range []*memapi.View{writer, mid, ro1} {
			if err := m.UnmapView(bg, v); err != nil {
				t.Fatal(err)
			}
		}
		for _, mp := range checkNoHole(t, uint64(r1.Addr()), uint64(r1.Addr())+uint64(r1.Size())) {
			if mp.perms != "---p" || mp.path != "" {
				t.Fatalf("unmapped view left %v, want PROT_NONE reserved space", mp)
			}
		}
		wantKind(t, write(s, addr(writer), []byte{1}), memapi.ErrNotCommitted)
		// The unmapped range can be committed like any reserved space.
		if err := m.Commit(bg, r1, memapi.Range{Off: 0, Len: size}, g); err != nil {
			t.Fatal(err)
		}
		if got := read(t, s, r1.Addr(), size); !allZero(got) {
			t.Fatal("memory committed where a view was does not read zeros")
		}
		if n, _ := m.ViewCount(b); n != 0 {
			t.Fatalf("ViewCount = %d after unmapping all", n)
		}
		if err := m.ReleaseBacking(bg, b, g); err != nil {
			t.Fatal(err)
		}
		wantKind(t, m.ReleaseBacking(bg, b, g), memapi.ErrReleased)
		if m.UsedBytes() != 2*size {
			t.Fatalf("UsedBytes = %d, want the copy and the commit, %d", m.UsedBytes(), 2*size)
		}
		checkKernel(t, m)
		if err := m.ReleaseReservation(bg, r1, g); err != nil {
			t.Fatal(err)
		}
		if err := m.UnmapView(bg, cow); err != nil {
			t.Fatal(err)
		}
		if err := m.ReleaseBacking(bg, cow.Backing(), g); err != nil {
			t.Fatal(err)
		}
		if err := m.ReleaseReservation(bg, r2, g); err != nil {
			t.Fatal(err)
		}
		checkKernel(t, m)
	})
}

// backingBlocks is what fstat reports allocated for b's memfd.
func backingBlocks(t testing.TB, m *Mechanism, b *memapi.Backing) memapi.Bytes {
	t.Helper()
	bs, err := m.backingOf("test", b)
	if err != nil {
		t.Fatal(err)
	}
	n, err := fileBytes(bs.fd)
	if err != nil {
		t.Fatal(err)
	}
	return memapi.Bytes(n)
}

func TestSharedBadInput(t *testing.T) {
	gran := Granularity4KiB
	m := newMech(t, gran)
	other := newMech(t, gran)
	b, err := m.CreateBacking(bg, gran, g)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * gran})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(bg, res, memapi.Range{Off: 0, Len: gran}, g); err != nil {
		t.Fatal(err)
	}
	v, err := m.MapView(bg, res, memapi.Range{Off: 2 * gran, Len: gran}, b, memapi.AccessReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	ob, err := other.CreateBacking(bg, gran, g)
	if err != nil {
		t.Fatal(err)
	}
	ores, err := other.Reserve(bg, memapi.ReserveRequest{Size: gran})
	if err != nil {
		t.Fatal(err)
	}
	ov, err := other.MapView(bg, ores, memapi.Range{Off: 0, Len: gran}, ob, memapi.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	used := m.UsedBytes()
	rg := func(off, n memapi.Bytes) memapi.Range { return memapi.Range{Off: off, Len: n} }
	mapErr := func(res *memapi.Reservation, r memapi.Range, b *memapi.Backing, a memapi.Access) func() error {
		return func() error {
			v, err := m.MapView(bg, res, r, b, a)
			if v != nil {
				t.Errorf("MapView returned a view with error %v", err)
			}
			return err
		}
	}
	for _, tc := range []struct {
		name string
		call func() error
		kind error
	}{
		{"create/zero", func() error { _, err := m.CreateBacking(bg, 0, g); return err }, memapi.ErrInvalidSize},
		{"create/absurd", func() error { _, err := m.CreateBacking(bg, 1<<62, g); return err }, memapi.ErrInvalidSize},
		{"create/no-grant", func() error { _, err := m.CreateBacking(bg, gran, nil); return err }, memapi.ErrNoGrant},
		{"map/committed", mapErr(res, rg(0, gran), b, memapi.AccessReadOnly), memapi.ErrCommitted},
		{"map/mapped", mapErr(res, rg(2*gran, gran), b, memapi.AccessReadOnly), memapi.ErrCommitted},
		{"map/outside", mapErr(res, rg(4*gran, gran), b, memapi.AccessReadOnly), memapi.ErrInvalidRange},
		{"map/wrong-length", mapErr(res, rg(gran, 2*gran), b, memapi.AccessReadOnly), memapi.ErrInvalidRange},
		{"map/bad-access", mapErr(res, rg(gran, gran), b, memapi.Access(7)), memapi.ErrUnsupported},
		{"map/foreign-backing", mapErr(res, rg(gran, gran), ob, memapi.AccessReadOnly), memapi.ErrForeignHandle},
		{"map/foreign-reservation", mapErr(ores, rg(0, gran), b, memapi.AccessReadOnly), memapi.ErrForeignHandle},
		{"map/nil-backing", mapErr(res, rg(gran, gran), nil, memapi.AccessReadOnly), memapi.ErrNilHandle},
		{"unmap/foreign", func() error { return m.UnmapView(bg, ov) }, memapi.ErrForeignHandle},
		{"unmap/nil", func() error { return m.UnmapView(bg, nil) }, memapi.ErrNilHandle},
		{"cow/foreign", func() error { _, err := m.CopyOnWrite(bg, ov, g); return err }, memapi.ErrForeignHandle},
		{"cow/no-grant", func() error { _, err := m.CopyOnWrite(bg, v, nil); return err }, memapi.ErrNoGrant},
		{"viewcount/foreign", func() error { _, err := m.ViewCount(ob); return err }, memapi.ErrForeignHandle},
		{"release/foreign", func() error { return m.ReleaseBacking(bg, ob, g) }, memapi.ErrForeignHandle},
		{"release/in-use", func() error { return m.ReleaseBacking(bg, b, g) }, memapi.ErrInUse},
		{"decommit/view", func() error { return m.Decommit(bg, res, rg(2*gran, gran), g) }, memapi.ErrNotCommitted},
		{"commit/view", func() error { return m.Commit(bg, res, rg(2*gran, gran), g) }, memapi.ErrCommitted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantKind(t, tc.call(), tc.kind)
			if n, _ := m.ViewCount(b); n != 1 || m.UsedBytes() != used || !v.Live() || !b.Live() {
				t.Fatalf("a rejected call changed state: views %d, used %d (want %d)", n, m.UsedBytes(), used)
			}
			checkKernel(t, m)
		})
	}
	if err := m.UnmapView(bg, v); err != nil {
		t.Fatal(err)
	}
	wantKind(t, m.UnmapView(bg, v), memapi.ErrReleased)
	if _, err := m.CopyOnWrite(bg, v, g); err == nil {
		t.Fatal("CopyOnWrite of an unmapped view succeeded")
	}
	for _, err := range []error{m.ReleaseReservation(bg, res, g), m.ReleaseBacking(bg, b, g),
		other.UnmapView(bg, ov), other.ReleaseBacking(bg, ob, g), other.ReleaseReservation(bg, ores, g)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err = m.MapView(bg, res, rg(0, gran), b, memapi.AccessReadOnly)
	wantKind(t, err, memapi.ErrReleased)
	_, err = m.ViewCount(b)
	wantKind(t, err, memapi.ErrReleased)
}
