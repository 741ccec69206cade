package cuda

import (
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Memory is never unmapped under the mechanism's own queued work: the clear
// of a Commit or a first view, the copy of a copy-on-write and a stream's
// device copies run after the call returns (the simulator queues them as the
// driver documents), and work still pending over an unmapped range faults the
// context at the next synchronize. Each case unmaps right after the work was
// queued, with nothing waiting in between.
func TestUnmapWaitsForQueuedWork(t *testing.T) {
	simOnly(t)
	cases := []struct {
		name string
		run  func(t *testing.T, m *Mechanism, s memapi.Stream, g memapi.Bytes) error
	}{
		{"Commit then Decommit", func(t *testing.T, m *Mechanism, _ memapi.Stream, g memapi.Bytes) error {
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * g})
			if err != nil {
				return err
			}
			if err := m.Commit(bg, res, memapi.Range{Len: 2 * g}, grantFor(m)); err != nil {
				return err
			}
			if err := m.Decommit(bg, res, memapi.Range{Len: 2 * g}, grantFor(m)); err != nil {
				return err
			}
			return m.ReleaseReservation(bg, res, grantFor(m))
		}},
		{"Commit then ReleaseReservation", func(t *testing.T, m *Mechanism, _ memapi.Stream, g memapi.Bytes) error {
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
			if err != nil {
				return err
			}
			if err := m.Commit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
				return err
			}
			return m.ReleaseReservation(bg, res, grantFor(m))
		}},
		{"MapView then UnmapView", func(t *testing.T, m *Mechanism, _ memapi.Stream, g memapi.Bytes) error {
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
			if err != nil {
				return err
			}
			b, err := m.CreateBacking(bg, g, grantFor(m))
			if err != nil {
				return err
			}
			v, err := m.MapView(bg, res, memapi.Range{Len: g}, b, memapi.AccessReadWrite)
			if err != nil {
				return err
			}
			if err := m.UnmapView(bg, v); err != nil {
				return err
			}
			if err := m.ReleaseBacking(bg, b, grantFor(m)); err != nil {
				return err
			}
			return m.ReleaseReservation(bg, res, grantFor(m))
		}},
		{"read-only MapView", func(t *testing.T, m *Mechanism, s memapi.Stream, g memapi.Bytes) error {
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
			if err != nil {
				return err
			}
			b, err := m.CreateBacking(bg, g, grantFor(m))
			if err != nil {
				return err
			}
			// The clear runs through a read-write mapping that then turns read-only.
			v, err := m.MapView(bg, res, memapi.Range{Len: g}, b, memapi.AccessReadOnly)
			if err != nil {
				return err
			}
			if err := s.Synchronize(bg); err != nil {
				return err
			}
			if err := m.UnmapView(bg, v); err != nil {
				return err
			}
			if err := m.ReleaseBacking(bg, b, grantFor(m)); err != nil {
				return err
			}
			return m.ReleaseReservation(bg, res, grantFor(m))
		}},
		{"CopyOnWrite", func(t *testing.T, m *Mechanism, s memapi.Stream, g memapi.Bytes) error {
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
			if err != nil {
				return err
			}
			b, err := m.CreateBacking(bg, g, grantFor(m))
			if err != nil {
				return err
			}
			v, err := m.MapView(bg, res, memapi.Range{Len: g}, b, memapi.AccessReadOnly)
			if err != nil {
				return err
			}
			own, err := m.CopyOnWrite(bg, v, grantFor(m))
			if err != nil {
				return err
			}
			if err := m.UnmapView(bg, own); err != nil {
				return err
			}
			if err := m.ReleaseBacking(bg, own.Backing(), grantFor(m)); err != nil {
				return err
			}
			if err := m.ReleaseBacking(bg, b, grantFor(m)); err != nil {
				return err
			}
			return m.ReleaseReservation(bg, res, grantFor(m))
		}},
		{"stream copy then Decommit", func(t *testing.T, m *Mechanism, s memapi.Stream, g memapi.Bytes) error {
			res, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
			if err != nil {
				return err
			}
			if err := m.Commit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
				return err
			}
			if err := s.Synchronize(bg); err != nil {
				return err
			}
			if err := s.CopyToDevice(res.Addr(), pattern(4096, 3)); err != nil {
				return err
			}
			if err := m.Decommit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
				return err
			}
			return m.ReleaseReservation(bg, res, grantFor(m))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, sim := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{})
			s := stream(t, m)
			if err := tc.run(t, m, s, m.Info().Granularity); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(bg); err != nil {
				t.Errorf("Synchronize after the unmap: %v", err)
			}
			if st := sim.Stats(); st.Sticky != driver.Success || st.PendingWork != 0 {
				t.Errorf("sticky %v, %d work items pending: work ran over unmapped memory", st.Sticky, st.PendingWork)
			}
		})
	}
}
