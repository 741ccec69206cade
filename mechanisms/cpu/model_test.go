package cpu

import (
	"bytes"
	"errors"
	"testing"

	"pgregory.net/rapid"

	"github.com/memgen/memgen/generated/memapi"
)

// TestReservationModel runs random sequences of Commit, Decommit, MapView,
// UnmapView and CopyOnWrite on one reservation against a model that tracks
// each chunk (empty, committed, or mapped by a view), and checks after every
// step: the error kind the model predicts, CommittedBytes and UsedBytes, the
// kernel's figures (mincore, memfd blocks), the bytes each chunk holds, and
// that a copy into each chunk fails or succeeds as its state says.
func TestReservationModel(t *testing.T) {
	const chunks = 12
	gran := Granularity4KiB
	rapid.Check(t, func(rt *rapid.T) {
		m, err := New(Options{Granularity: gran})
		if err != nil {
			rt.Fatal(err)
		}
		c := NewContext(m)
		s, err := c.NewStream()
		if err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = s.Close(); _ = c.Close() }()
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: chunks * gran})
		if err != nil {
			rt.Fatal(err)
		}
		type chunk struct {
			state byte // 0 empty, 'c' committed, 'v' view
			view  *memapi.View
			data  byte // the byte every position of the chunk holds
		}
		var model [chunks]chunk
		backings := map[*memapi.Backing]bool{} // live backings -> true
		used := func() memapi.Bytes {
			var n memapi.Bytes
			for _, ch := range model {
				if ch.state == 'c' {
					n += gran
				}
			}
			return n + memapi.Bytes(len(backings))*gran
		}
		addr := func(i int) memapi.DeviceAddr { return res.Addr() + memapi.DeviceAddr(i)*memapi.DeviceAddr(gran) }
		rng := func(i, n int) memapi.Range {
			return memapi.Range{Off: memapi.Bytes(i) * gran, Len: memapi.Bytes(n) * gran}
		}
		// span reports the state every chunk of [i, i+n) shares, or 0 if mixed.
		span := func(i, n int) (byte, bool) {
			st := model[i].state
			for j := i; j < i+n; j++ {
				if model[j].state != st {
					return 0, false
				}
			}
			return st, true
		}
		free := func(i, n int) bool {
			for j := i; j < i+n; j++ {
				if model[j].state != 0 {
					return false
				}
			}
			return true
		}
		expect := func(err, kind error) {
			rt.Helper()
			if kind == nil && err != nil {
				rt.Fatalf("unexpected error %v", err)
			}
			if kind != nil && !errors.Is(err, kind) {
				rt.Fatalf("got %v, want %v", err, kind)
			}
		}
		for step := 0; step < 30; step++ {
			i := rapid.IntRange(0, chunks-1).Draw(rt, "chunk")
			n := rapid.IntRange(1, 3).Draw(rt, "len")
			if i+n > chunks {
				n = chunks - i
			}
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0: // Commit
				err := m.Commit(bg, res, rng(i, n), g)
				if free(i, n) {
					expect(err, nil)
					for j := i; j < i+n; j++ {
						model[j] = chunk{state: 'c'}
					}
				} else {
					expect(err, memapi.ErrCommitted)
				}
			case 1: // Decommit
				err := m.Decommit(bg, res, rng(i, n), g)
				if st, ok := span(i, n); ok && st == 'c' {
					expect(err, nil)
					for j := i; j < i+n; j++ {
						model[j] = chunk{}
					}
				} else {
					expect(err, memapi.ErrNotCommitted)
				}
			case 2: // MapView of a new one-chunk backing, read-only or read-write
				b, err := m.CreateBacking(bg, gran, g)
				expect(err, nil)
				access := memapi.Access(rapid.IntRange(1, 2).Draw(rt, "access"))
				v, err := m.MapView(bg, res, rng(i, 1), b, access)
				if model[i].state == 0 {
					expect(err, nil)
					model[i] = chunk{state: 'v', view: v}
					backings[b] = true
				} else {
					expect(err, memapi.ErrCommitted)
					expect(m.ReleaseBacking(bg, b, g), nil)
				}
			case 3: // UnmapView and release its backing
				if model[i].state != 'v' {
					continue
				}
				v := model[i].view
				expect(m.UnmapView(bg, v), nil)
				expect(m.ReleaseBacking(bg, v.Backing(), g), nil)
				delete(backings, v.Backing())
				model[i] = chunk{}
			case 4: // CopyOnWrite: the old backing loses its only view and goes
				if model[i].state != 'v' {
					continue
				}
				old := model[i].view
				v, err := m.CopyOnWrite(bg, old, g)
				expect(err, nil)
				expect(m.ReleaseBacking(bg, old.Backing(), g), nil)
				delete(backings, old.Backing())
				backings[v.Backing()] = true
				model[i].view = v
			case 5: // write a byte pattern into the chunk
				d := byte(rapid.IntRange(1, 255).Draw(rt, "data"))
				err := write(s, addr(i), bytes.Repeat([]byte{d}, int(gran)))
				switch {
				case model[i].state == 0:
					expect(err, memapi.ErrNotCommitted)
				case model[i].state == 'v' && model[i].view.Access() == memapi.AccessReadOnly:
					expect(err, memapi.ErrReadOnly)
				default:
					expect(err, nil)
					model[i].data = d
				}
			}
			// The figures agree with the model and the kernel with both.
			var committed memapi.Bytes
			for _, ch := range model {
				if ch.state == 'c' {
					committed += gran
				}
			}
			if got, _ := m.CommittedBytes(res); got != committed {
				rt.Fatalf("CommittedBytes = %d, model %d", got, committed)
			}
			if m.UsedBytes() != used() {
				rt.Fatalf("UsedBytes = %d, model %d", m.UsedBytes(), used())
			}
			if k, err := m.KernelBytes(); err != nil || k != used() {
				rt.Fatalf("kernel reports %d (%v), model %d", k, err, used())
			}
			for j, ch := range model {
				if ch.state == 0 {
					continue
				}
				got := make([]byte, gran)
				if err := s.CopyFromDevice(got, addr(j)); err != nil {
					rt.Fatal(err)
				}
				if err := s.Synchronize(bg); err != nil {
					rt.Fatal(err)
				}
				if !bytes.Equal(got, bytes.Repeat([]byte{ch.data}, int(gran))) {
					rt.Fatalf("chunk %d does not hold %d", j, ch.data)
				}
			}
		}
		for _, ch := range model {
			if ch.state == 'v' {
				expect(m.UnmapView(bg, ch.view), nil)
				expect(m.ReleaseBacking(bg, ch.view.Backing(), g), nil)
			}
		}
		expect(m.ReleaseReservation(bg, res, g), nil)
		if m.UsedBytes() != 0 || m.Stats() != (Stats{}) {
			rt.Fatalf("leftovers: %+v", m.Stats())
		}
	})
}
