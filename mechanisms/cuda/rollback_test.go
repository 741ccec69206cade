package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// snapshot is everything a failed operation must leave as it was.
type snapshot struct {
	dev            cudasim.Stats
	used, pooled   memapi.Bytes
	committed      memapi.Bytes
	views          int
	bytesAtOrigin  []byte
	bytesAtChunk1  []byte
	liveView       bool
	liveBacking    bool
	liveAllocation bool
}

// scene is a mechanism prepared for one operation: a reservation of four
// chunks with chunks 0 and 1 committed and written, a two-chunk backing
// mapped read-only at chunk 2 (written first), and an allocation.
type scene struct {
	m   *Mechanism
	sim *cudasim.Sim
	s   memapi.Stream
	g   memapi.Bytes
	res *memapi.Reservation
	b   *memapi.Backing
	v   *memapi.View
	a   *memapi.Allocation
}

func newScene(t *testing.T) *scene {
	t.Helper()
	sim := cudasim.New(cudasim.Config{})
	m, err := New(Config{Driver: sim.Table(), PoolChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	// The scene's handles stay live: Close releases them, and the device
	// must be empty afterwards.
	t.Cleanup(func() {
		if err := m.Close(); !errors.Is(err, memapi.ErrInUse) {
			t.Errorf("Close: %v, want the scene's handles reported", err)
		}
		if st := sim.Stats(); st.Used != 0 || st.Handles != 0 || st.Mappings != 0 || st.Reservations != 0 || st.Blocks != 0 {
			t.Errorf("device after Close: %+v", st)
		}
	})
	sc := &scene{m: m, sim: sim, s: stream(t, m), g: memapi.Bytes(m.Info().Granularity)}
	g, gr := sc.g, grantFor(m)
	if sc.res, err = m.Reserve(bg, memapi.ReserveRequest{Size: 6 * g}); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(bg, sc.res, memapi.Range{Len: 2 * g}, gr); err != nil {
		t.Fatal(err)
	}
	if err := write(t, sc.s, sc.res.Addr(), pattern(int(2*g), 1)); err != nil {
		t.Fatal(err)
	}
	if sc.b, err = m.CreateBacking(bg, 2*g, gr); err != nil {
		t.Fatal(err)
	}
	rw, err := m.MapView(bg, sc.res, memapi.Range{Off: 2 * g, Len: 2 * g}, sc.b, memapi.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(t, sc.s, sc.res.Addr()+memapi.DeviceAddr(2*g), pattern(int(2*g), 2)); err != nil {
		t.Fatal(err)
	}
	if err := m.UnmapView(bg, rw); err != nil {
		t.Fatal(err)
	}
	if sc.v, err = m.MapView(bg, sc.res, memapi.Range{Off: 2 * g, Len: 2 * g}, sc.b, memapi.AccessReadOnly); err != nil {
		t.Fatal(err)
	}
	if sc.a, err = m.Allocate(bg, memapi.AllocRequest{Size: 1}, gr); err != nil {
		t.Fatal(err)
	}
	return sc
}

func (sc *scene) snap(t *testing.T) snapshot {
	t.Helper()
	c, err := sc.m.CommittedBytes(sc.res)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sc.m.ViewCount(sc.b)
	if err != nil {
		t.Fatal(err)
	}
	at0, err := read(t, sc.s, sc.res.Addr(), 64)
	if err != nil {
		t.Fatalf("reading chunk 0: %v", err)
	}
	at2, err := read(t, sc.s, sc.res.Addr()+memapi.DeviceAddr(2*sc.g), 64)
	if err != nil {
		t.Fatalf("reading the view: %v", err)
	}
	return snapshot{
		dev: sc.sim.Stats(), used: sc.m.UsedBytes(), pooled: sc.m.PooledBytes(),
		committed: c, views: n, bytesAtOrigin: at0, bytesAtChunk1: at2,
		liveView: sc.v.Live(), liveBacking: sc.b.Live(), liveAllocation: sc.a.Live(),
	}
}

func (s snapshot) equal(o snapshot) bool {
	return s.dev == o.dev && s.used == o.used && s.pooled == o.pooled && s.committed == o.committed &&
		s.views == o.views && bytes.Equal(s.bytesAtOrigin, o.bytesAtOrigin) &&
		bytes.Equal(s.bytesAtChunk1, o.bytesAtChunk1) && s.liveView == o.liveView &&
		s.liveBacking == o.liveBacking && s.liveAllocation == o.liveAllocation
}

// TestFaultAtEveryStep makes each driver call of each multi-call operation
// fail in turn and checks that the operation fails with the code's kind and
// leaves the device, the mechanism's counters, the handles and the bytes as
// they were (no-partial-state); then the same operation succeeds.
func TestFaultAtEveryStep(t *testing.T) {
	simOnly(t)
	type step struct {
		call string
		nth  int
	}
	ops := []struct {
		name  string
		steps []step
		run   func(sc *scene) error
	}{
		{"Commit", []step{{"cuMemCreate", 1}, {"cuMemCreate", 2}, {"cuMemMap", 1}, {"cuMemMap", 2}, {"cuMemSetAccess", 1}, {"cuMemsetD8", 1},
			{"cuEventCreate", 1}, {"cuEventRecord", 1}, {"cuEventQuery", 1}},
			func(sc *scene) error {
				return sc.m.Commit(bg, sc.res, memapi.Range{Off: 4 * sc.g, Len: 2 * sc.g}, grantFor(sc.m))
			}},
		{"Decommit", []step{{"cuMemUnmap", 1}, {"cuMemUnmap", 2}},
			func(sc *scene) error {
				return sc.m.Decommit(bg, sc.res, memapi.Range{Len: 2 * sc.g}, grantFor(sc.m))
			}},
		{"CreateBacking", []step{{"cuMemCreate", 1}},
			func(sc *scene) error {
				b, err := sc.m.CreateBacking(bg, sc.g, grantFor(sc.m))
				if err == nil {
					return sc.m.ReleaseBacking(bg, b, grantFor(sc.m))
				}
				return err
			}},
		{"MapView", []step{{"cuMemMap", 1}, {"cuMemSetAccess", 1}, {"cuMemsetD8", 1}, {"cuEventCreate", 1}, {"cuEventRecord", 1},
			{"cuEventQuery", 1}, {"cuMemSetAccess", 2}},
			func(sc *scene) error {
				b, err := sc.m.CreateBacking(bg, 2*sc.g, grantFor(sc.m))
				if err != nil {
					return fmt.Errorf("setup: %w", err)
				}
				v, err := sc.m.MapView(bg, sc.res, memapi.Range{Off: 4 * sc.g, Len: 2 * sc.g}, b, memapi.AccessReadOnly)
				if err == nil {
					err = sc.m.UnmapView(bg, v)
				}
				if rerr := sc.m.ReleaseBacking(bg, b, grantFor(sc.m)); rerr != nil {
					return fmt.Errorf("cleanup: %w", rerr)
				}
				return err
			}},
		{"UnmapView", []step{{"cuMemUnmap", 1}},
			func(sc *scene) error { return sc.m.UnmapView(bg, sc.v) }},
		{"CopyOnWrite", []step{{"cuMemCreate", 1}, {"cuMemAddressReserve", 1}, {"cuMemMap", 1}, {"cuMemSetAccess", 1},
			{"cuMemcpyDtoD", 1}, {"cuStreamSynchronize", 1}, {"cuMemUnmap", 2}, {"cuMemMap", 2}, {"cuMemSetAccess", 2}},
			func(sc *scene) error {
				_, err := sc.m.CopyOnWrite(bg, sc.v, grantFor(sc.m))
				return err
			}},
		{"ReleaseReservation", []step{{"cuStreamSynchronize", 1}, {"cuMemUnmap", 1}, {"cuMemUnmap", 2}, {"cuMemAddressFree", 1}},
			func(sc *scene) error {
				if err := sc.m.UnmapView(bg, sc.v); err != nil {
					return fmt.Errorf("setup: %w", err)
				}
				// a second reservation, with what the scene's first one has committed
				r, err := sc.m.Reserve(bg, memapi.ReserveRequest{Size: 2 * sc.g})
				if err != nil {
					return fmt.Errorf("setup: %w", err)
				}
				if err := sc.m.Commit(bg, r, memapi.Range{Len: 2 * sc.g}, grantFor(sc.m)); err != nil {
					return fmt.Errorf("setup: %w", err)
				}
				sc.sim.FailCall(pendingCall, pendingNth, driver.ErrInvalidValue)
				err = sc.m.ReleaseReservation(bg, r, grantFor(sc.m))
				if err != nil {
					// Roll the scene back to its snapshot, releasing r for real.
					if rerr := sc.m.ReleaseReservation(bg, r, grantFor(sc.m)); rerr != nil {
						return fmt.Errorf("cleanup: %w", rerr)
					}
				}
				v, merr := sc.m.MapView(bg, sc.res, memapi.Range{Off: 2 * sc.g, Len: 2 * sc.g}, sc.b, memapi.AccessReadOnly)
				if merr != nil {
					return fmt.Errorf("cleanup: %w", merr)
				}
				sc.v = v
				return err
			}},
		{"Allocate", []step{{"cuMemAlloc", 1}},
			func(sc *scene) error {
				a, err := sc.m.Allocate(bg, memapi.AllocRequest{Size: 1}, grantFor(sc.m))
				if err == nil {
					return sc.m.Free(bg, a, grantFor(sc.m))
				}
				return err
			}},
		{"Free", []step{{"cuMemFree", 1}},
			func(sc *scene) error { return sc.m.Free(bg, sc.a, grantFor(sc.m)) }},
	}
	for _, op := range ops {
		for _, st := range op.steps {
			t.Run(fmt.Sprintf("%s/%s#%d", op.name, st.call, st.nth), func(t *testing.T) {
				sc := newScene(t)
				before := sc.snap(t)
				code := driver.ErrOutOfMemory
				if st.call == "cuMemUnmap" || st.call == "cuMemAddressFree" || st.call == "cuMemFree" || st.call == "cuStreamSynchronize" {
					code = driver.ErrInvalidValue
				}
				if op.name == "ReleaseReservation" {
					pendingCall, pendingNth = st.call, st.nth // injected once the setup is done
				} else {
					sc.sim.FailCall(st.call, st.nth, code)
				}
				err := op.run(sc)
				var de *DriverError
				if !errors.As(err, &de) || de.Code != code || !errors.Is(err, Kind(de.Call, code)) {
					t.Fatalf("%s with %s#%d failing: %v, want the injected %v", op.name, st.call, st.nth, err, code)
				}
				if after := sc.snap(t); !after.equal(before) {
					t.Errorf("state changed by the failed %s:\nbefore %+v\nafter  %+v", op.name, before, after)
				}
				if op.name != "ReleaseReservation" {
					if err := op.run(sc); err != nil {
						t.Errorf("%s after the failure: %v", op.name, err)
					}
				}
			})
		}
	}
}

// The step ReleaseReservation's subtest injects after its own setup.
var (
	pendingCall string
	pendingNth  int
)
