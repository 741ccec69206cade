package cpu

import (
	"bytes"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

func TestNew(t *testing.T) {
	m, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	info := m.Info()
	want := memapi.MechanismInfo{
		Mechanism:        "cpu",
		Instance:         info.Instance,
		Device:           memapi.DeviceKey{Kind: memapi.DeviceKindHost},
		Authority:        DefaultAuthority,
		AllocGranularity: memapi.Bytes(pageSize),
		Granularity:      Granularity2MiB,
	}
	if info != want || info.Instance == 0 {
		t.Fatalf("Info() = %+v, want %+v", info, want)
	}
	if got := memapi.Negotiate(m); got != memapi.Of(memapi.CapDeviceAllocator, memapi.CapVirtualBacking, memapi.CapSharedMapping) {
		t.Fatalf("Negotiate = %v", got)
	}
	m2, err := New(Options{Granularity: Granularity4KiB, Authority: "numa1", Ordinal: 1})
	if err != nil {
		t.Fatal(err)
	}
	if i2 := m2.Info(); i2.Granularity != Granularity4KiB || i2.Authority != "numa1" || i2.Device.Ordinal != 1 || i2.Instance == info.Instance {
		t.Fatalf("Info() = %+v", i2)
	}
	for _, bad := range []memapi.Bytes{1, 4096 + 1, 3 << 20, 2 << 30, memapi.Bytes(pageSize) / 2} {
		_, err := New(Options{Granularity: bad})
		wantKind(t, err, memapi.ErrInvalidSize)
	}
}

func TestAllocateFree(t *testing.T) {
	m := newMech(t, 0)
	s := newStream(t, m)
	ps := memapi.Bytes(pageSize)
	for _, tc := range []struct {
		size, align, want memapi.Bytes
	}{
		{1, 0, ps},
		{ps, 0, ps},
		{ps + 1, 0, 2 * ps},
		{3 * ps, 0, 3 * ps},
		{5000, 2 * mib, 2 * ps},
		{ps, 64 * kib, ps},
		{ps, 8, ps},
	} {
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: tc.size, Align: tc.align}, g)
		if err != nil {
			t.Fatalf("Allocate(%d, align %d): %v", tc.size, tc.align, err)
		}
		if a.Size() != tc.want {
			t.Errorf("Allocate(%d).Size() = %d, want %d", tc.size, a.Size(), tc.want)
		}
		if al := max(tc.align, ps); uint64(a.Addr())%uint64(al) != 0 {
			t.Errorf("Allocate(%d, align %d).Addr() = %#x is not aligned", tc.size, tc.align, a.Addr())
		}
		if u := m.UsedBytes(); u != tc.want {
			t.Errorf("UsedBytes = %d, want %d", u, tc.want)
		}
		// Populated at Allocate: the kernel already holds every page.
		if r := residentAt(t, m, a.Addr(), a.Size()); r != a.Size() {
			t.Errorf("resident = %d after Allocate, want %d", r, a.Size())
		}
		checkKernel(t, m)
		if got := read(t, s, a.Addr(), a.Size()); !allZero(got) {
			t.Errorf("fresh allocation does not read zeros")
		}
		data := pattern(a.Size(), byte(tc.size))
		if err := write(s, a.Addr(), data); err != nil {
			t.Fatal(err)
		}
		if got := read(t, s, a.Addr(), a.Size()); !bytes.Equal(got, data) {
			t.Errorf("read back differs")
		}
		if err := m.Free(bg, a, g); err != nil {
			t.Fatal(err)
		}
		if a.Live() {
			t.Errorf("allocation live after Free")
		}
		if u := m.UsedBytes(); u != 0 {
			t.Errorf("UsedBytes = %d after Free", u)
		}
		m.mu.RLock()
		indexed := m.lookup(uint64(a.Addr())) != nil
		m.mu.RUnlock()
		if indexed {
			t.Errorf("freed allocation still indexed")
		}
	}
}

func TestAllocateBadInput(t *testing.T) {
	m := newMech(t, 0)
	other := newMech(t, 0)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, g)
	if err != nil {
		t.Fatal(err)
	}
	before := m.UsedBytes()
	for _, tc := range []struct {
		name string
		req  memapi.AllocRequest
		gr   memapi.Grant
		kind error
	}{
		{"zero", memapi.AllocRequest{Size: 0}, g, memapi.ErrInvalidSize},
		{"absurd", memapi.AllocRequest{Size: 1 << 62}, g, memapi.ErrInvalidSize},
		{"max", memapi.AllocRequest{Size: ^memapi.Bytes(0)}, g, memapi.ErrInvalidSize},
		{"align-not-pow2", memapi.AllocRequest{Size: 1, Align: 3 * mib}, g, memapi.ErrInvalidSize},
		{"align-not-pow2-below-page", memapi.AllocRequest{Size: 1, Align: 3}, g, memapi.ErrInvalidSize},
		{"align-absurd", memapi.AllocRequest{Size: 1, Align: 1 << 40}, g, memapi.ErrInvalidSize},
		{"no-grant", memapi.AllocRequest{Size: 1}, nil, memapi.ErrNoGrant},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := m.Allocate(bg, tc.req, tc.gr)
			wantKind(t, err, tc.kind)
			if got != nil {
				t.Fatalf("got an allocation with an error")
			}
			if u := m.UsedBytes(); u != before {
				t.Fatalf("UsedBytes moved %d -> %d", before, u)
			}
		})
	}
	wantKind(t, other.Free(bg, a, g), memapi.ErrForeignHandle)
	wantKind(t, m.Free(bg, nil, g), memapi.ErrNilHandle)
	if !a.Live() || m.UsedBytes() != before {
		t.Fatal("a rejected Free changed state")
	}
	if err := m.Free(bg, a, g); err != nil {
		t.Fatal(err)
	}
	wantKind(t, m.Free(bg, a, g), memapi.ErrReleased)
	checkKernel(t, m)
}
