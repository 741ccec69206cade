package cuda

import (
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// Reservations are aligned to the granularity because the mechanism asks for
// it: the driver documents no default alignment, and the simulator's default
// is the host page only. Each reservation is committed where it starts, and
// a copy-on-write's scratch reservation is mapped too.
func TestReservationAlignment(t *testing.T) {
	m, _ := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{})
	g := m.Info().Granularity
	gr := grantFor(m)
	for _, size := range []memapi.Bytes{1, g, g + 4096, 3 * g, 1 << 40} {
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: size})
		if err != nil {
			t.Fatalf("Reserve(%d): %v", size, err)
		}
		if uint64(res.Addr())%uint64(g) != 0 {
			t.Errorf("Reserve(%d) at %#x, not a multiple of the granularity %d", size, res.Addr(), g)
		}
		if err := m.Commit(bg, res, memapi.Range{Len: g}, gr); err != nil {
			t.Errorf("Commit at the start of a reservation of %d: %v", size, err)
		} else if err := m.Decommit(bg, res, memapi.Range{Len: g}, gr); err != nil {
			t.Error(err)
		}
		if err := m.ReleaseReservation(bg, res, gr); err != nil {
			t.Fatal(err)
		}
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * g})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, gr)
	b, err := m.CreateBacking(bg, g, gr)
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.MapView(bg, res, memapi.Range{Len: g}, b, memapi.AccessReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	nv, err := m.CopyOnWrite(bg, v, gr)
	if err != nil {
		t.Fatalf("CopyOnWrite: %v", err)
	}
	if err := m.UnmapView(bg, nv); err != nil {
		t.Fatal(err)
	}
	for _, bk := range []*memapi.Backing{b, nv.Backing()} {
		if err := m.ReleaseBacking(bg, bk, gr); err != nil {
			t.Fatal(err)
		}
	}
}
