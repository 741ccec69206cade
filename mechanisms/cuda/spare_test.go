package cuda

import (
	"bytes"
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// vmmCalls is the driver calls a commit or decommit can make.
var vmmCalls = []string{"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemsetD8", "cuStreamSynchronize", "cuMemUnmap", "cuMemRelease"}

func callsOf(sim *cudasim.Sim, names ...string) map[string]int {
	c := map[string]int{}
	for _, n := range names {
		c[n] = sim.Calls(n)
	}
	return c
}

func diff(after, before map[string]int) map[string]int {
	d := map[string]int{}
	for n, v := range after {
		if v != before[n] {
			d[n] = v - before[n]
		}
	}
	return d
}

// A growing reservation finds its next chunk already mapped: the refiller
// maps a spare past each Commit, off the caller's path, so the next Commit
// there costs one cuMemsetD8. A Decommit keeps chunks as spares (no driver
// call), copies never reach a spare, a view over one evicts it, and the
// device holds exactly UsedBytes + PooledBytes throughout.
func TestSpares(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{PoolChunks: 4, SpareChunks: 2})
	g := memapi.Bytes(m.Info().Granularity)
	s := stream(t, m)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 8 * g})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	m.quiesce()
	honest(t, m, sim)
	if m.spares != 1 || m.PooledBytes() != 3*g {
		t.Fatalf("after a Commit: %d spares, PooledBytes %d; want 1 spare and 3 chunks (2 pooled, the spare)", m.spares, m.PooledBytes())
	}
	// The spare is not committed memory: copies refuse it.
	if err := write(t, s, res.Addr()+memapi.DeviceAddr(g), []byte{1}); !errors.Is(err, memapi.ErrNotCommitted) {
		t.Errorf("copy into a spare: %v, want ErrNotCommitted", err)
	}
	before := callsOf(sim, vmmCalls...)
	if err := m.Commit(bg, res, memapi.Range{Off: g, Len: g}, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	if d := diff(callsOf(sim, vmmCalls...), before); len(d) != 1 || d["cuMemsetD8"] != 1 {
		t.Errorf("Commit of a spare chunk made %v, want only one cuMemsetD8", d)
	}
	got, err := read(t, s, res.Addr()+memapi.DeviceAddr(g), int(g))
	if err != nil || bytes.IndexFunc(got, func(r rune) bool { return r != 0 }) >= 0 {
		t.Errorf("a committed spare does not read zeros (%v)", err)
	}
	m.quiesce()
	honest(t, m, sim)
	if err := write(t, s, res.Addr(), pattern(int(2*g), 5)); err != nil {
		t.Fatal(err)
	}
	// Decommit keeps what fits as spares, without a driver call.
	before = callsOf(sim, vmmCalls...)
	if err := m.Decommit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	if d := diff(callsOf(sim, vmmCalls...), before); len(d) != 0 {
		t.Errorf("Decommit into a spare made %v, want no driver call", d)
	}
	honest(t, m, sim)
	if m.UsedBytes() != g {
		t.Errorf("UsedBytes = %d after decommitting one of two chunks", m.UsedBytes())
	}
	// Recommitted, the spare reads zeros, not the old bytes.
	if err := m.Commit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	got, err = read(t, s, res.Addr(), int(g))
	if err != nil || bytes.IndexFunc(got, func(r rune) bool { return r != 0 }) >= 0 {
		t.Errorf("a recommitted spare does not read zeros (%v)", err)
	}
	m.quiesce()
	// A view over a spare evicts it.
	b, err := m.CreateBacking(bg, g, grantFor(m))
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.MapView(bg, res, memapi.Range{Off: 2 * g, Len: g}, b, memapi.AccessReadOnly)
	if err != nil {
		t.Fatalf("MapView over a spare: %v", err)
	}
	honest(t, m, sim)
	if err := m.UnmapView(bg, v); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseBacking(bg, b, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseReservation(bg, res, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	m.quiesce()
	honest(t, m, sim)
	if st := sim.Stats(); st.Mappings != 0 || m.spares != 0 {
		t.Errorf("after ReleaseReservation: %d mappings, %d spares", st.Mappings, m.spares)
	}
	if m.PooledBytes() > m.PoolLimit() {
		t.Errorf("PooledBytes %d beyond PoolLimit %d", m.PooledBytes(), m.PoolLimit())
	}
}

// A refill the driver refuses (OUT_OF_MEMORY at cuMemMap or cuMemSetAccess,
// as a driver short of page-table memory may answer) leaves no spare and no
// lost handle: the pool gets it back, the device holds UsedBytes +
// PooledBytes, and the next Commit there takes the ordinary path.
func TestSpareRefillRefused(t *testing.T) {
	simOnly(t)
	for _, call := range []string{"cuMemMap", "cuMemSetAccess"} {
		t.Run(call, func(t *testing.T) {
			m, sim := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{PoolChunks: 4, SpareChunks: 2})
			g := memapi.Bytes(m.Info().Granularity)
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g})
			if err != nil {
				t.Fatal(err)
			}
			sim.FailCall(call, 2, driver.ErrOutOfMemory) // the Commit's own call is the first
			if err := m.Commit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
				t.Fatal(err)
			}
			m.quiesce()
			if m.spares != 0 {
				t.Errorf("%d spares after a refused refill", m.spares)
			}
			honest(t, m, sim)
			if err := m.Commit(bg, res, memapi.Range{Off: g, Len: g}, grantFor(m)); err != nil {
				t.Fatalf("Commit where the refill failed: %v", err)
			}
			m.quiesce()
			honest(t, m, sim)
			if err := m.ReleaseReservation(bg, res, grantFor(m)); err != nil {
				t.Fatal(err)
			}
			// Every handle the device still holds is one the pool knows.
			m.mu.Lock()
			known := len(m.pool) + m.spares
			m.mu.Unlock()
			if st := sim.Stats(); st.Handles != known {
				t.Errorf("the device holds %d handles, the pool knows %d", st.Handles, known)
			}
		})
	}
}
