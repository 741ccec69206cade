package checkedtest

import (
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// batch is how many calls a method workload makes between two untimed
// resets (freeing what was allocated, re-creating what was released).
const batch = 256

// workload drives one method of a mechanism, bare or wrapped: step makes
// call number k of a batch (0 <= k < batch) and reset prepares a fresh batch.
type workload struct {
	step  func(k int) error
	reset func() error
}

// methodWorkload builds the workload of one method over m, drawing from and
// refunding to l.
type methodWorkload struct {
	name string
	make func(m memapi.Mechanism, l *benchLedger) workload
}

func vbOf(m memapi.Mechanism) memapi.VirtualBacking { v, _ := m.AsVirtualBacking(); return v }
func smOf(m memapi.Mechanism) memapi.SharedMapping  { s, _ := m.AsSharedMapping(); return s }

func chunk(k int) memapi.Range { return memapi.Range{Off: memapi.Bytes(k) * testGran, Len: testGran} }

// views maps one read-only view per chunk of a batch-sized reservation.
type views struct {
	res *memapi.Reservation
	bs  []*memapi.Backing
	vs  []*memapi.View
}

func newViews(m memapi.Mechanism, l *benchLedger) *views {
	res, err := vbOf(m).Reserve(ctx, memapi.ReserveRequest{Size: batch * testGran})
	if err != nil {
		panic(err)
	}
	v := &views{res: res, bs: make([]*memapi.Backing, batch), vs: make([]*memapi.View, batch)}
	for k := range v.bs {
		if v.bs[k], err = smOf(m).CreateBacking(ctx, testGran, l); err != nil {
			panic(err)
		}
	}
	return v
}

func (v *views) mapAll(m memapi.Mechanism) error {
	for k := range v.vs {
		var err error
		if v.vs[k], err = smOf(m).MapView(ctx, v.res, chunk(k), v.bs[k], memapi.AccessReadOnly); err != nil {
			return err
		}
	}
	return nil
}

func (v *views) unmapAll(m memapi.Mechanism, l *benchLedger) error {
	for k, x := range v.vs {
		if x == nil || !x.Live() {
			continue
		}
		if err := smOf(m).UnmapView(ctx, x); err != nil {
			return err
		}
		if b := x.Backing(); b != v.bs[k] { // a copy-on-write backing
			if err := smOf(m).ReleaseBacking(ctx, b, l); err != nil {
				return err
			}
		}
	}
	return nil
}

var methodWorkloads = []methodWorkload{
	{"Allocate", func(m memapi.Mechanism, l *benchLedger) workload {
		as := make([]*memapi.Allocation, batch)
		return workload{
			step: func(k int) (err error) {
				as[k], err = m.Allocate(ctx, memapi.AllocRequest{Size: 1000}, l)
				return err
			},
			reset: func() error {
				for _, a := range as {
					if a != nil && a.Live() {
						if err := m.Free(ctx, a, l); err != nil {
							return err
						}
					}
				}
				return nil
			},
		}
	}},
	{"Free", func(m memapi.Mechanism, l *benchLedger) workload {
		as := make([]*memapi.Allocation, batch)
		return workload{
			step: func(k int) error { return m.Free(ctx, as[k], l) },
			reset: func() (err error) {
				for k := range as {
					if as[k], err = m.Allocate(ctx, memapi.AllocRequest{Size: 1000}, l); err != nil {
						return err
					}
				}
				return nil
			},
		}
	}},
	{"Reserve", func(m memapi.Mechanism, l *benchLedger) workload {
		rs := make([]*memapi.Reservation, batch)
		return workload{
			step: func(k int) (err error) {
				rs[k], err = vbOf(m).Reserve(ctx, memapi.ReserveRequest{Size: testGran})
				return err
			},
			reset: func() error {
				for _, r := range rs {
					if r != nil && r.Live() {
						if err := vbOf(m).ReleaseReservation(ctx, r, l); err != nil {
							return err
						}
					}
				}
				return nil
			},
		}
	}},
	{"ReleaseReservation", func(m memapi.Mechanism, l *benchLedger) workload {
		rs := make([]*memapi.Reservation, batch)
		return workload{
			step: func(k int) error { return vbOf(m).ReleaseReservation(ctx, rs[k], l) },
			reset: func() (err error) {
				for k := range rs {
					if rs[k], err = vbOf(m).Reserve(ctx, memapi.ReserveRequest{Size: testGran}); err != nil {
						return err
					}
				}
				return nil
			},
		}
	}},
	{"Commit", func(m memapi.Mechanism, l *benchLedger) workload {
		vb := vbOf(m)
		res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: batch * testGran})
		if err != nil {
			panic(err)
		}
		done := 0
		return workload{
			step: func(k int) error { done = k + 1; return vb.Commit(ctx, res, chunk(k), l) },
			reset: func() error {
				for k := range done {
					if err := vb.Decommit(ctx, res, chunk(k), l); err != nil {
						return err
					}
				}
				done = 0
				return nil
			},
		}
	}},
	{"Decommit", func(m memapi.Mechanism, l *benchLedger) workload {
		vb := vbOf(m)
		res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: batch * testGran})
		if err != nil {
			panic(err)
		}
		committed := make([]bool, batch)
		return workload{
			step: func(k int) error { committed[k] = false; return vb.Decommit(ctx, res, chunk(k), l) },
			reset: func() error {
				for k := range committed {
					if !committed[k] {
						if err := vb.Commit(ctx, res, chunk(k), l); err != nil {
							return err
						}
						committed[k] = true
					}
				}
				return nil
			},
		}
	}},
	{"CommittedBytes", func(m memapi.Mechanism, l *benchLedger) workload {
		vb := vbOf(m)
		res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: testGran})
		if err != nil {
			panic(err)
		}
		return workload{
			step:  func(int) error { _, err := vb.CommittedBytes(res); return err },
			reset: func() error { return nil },
		}
	}},
	{"CreateBacking", func(m memapi.Mechanism, l *benchLedger) workload {
		bs := make([]*memapi.Backing, batch)
		return workload{
			step: func(k int) (err error) {
				bs[k], err = smOf(m).CreateBacking(ctx, testGran, l)
				return err
			},
			reset: func() error {
				for _, b := range bs {
					if b != nil && b.Live() {
						if err := smOf(m).ReleaseBacking(ctx, b, l); err != nil {
							return err
						}
					}
				}
				return nil
			},
		}
	}},
	{"ReleaseBacking", func(m memapi.Mechanism, l *benchLedger) workload {
		bs := make([]*memapi.Backing, batch)
		return workload{
			step: func(k int) error { return smOf(m).ReleaseBacking(ctx, bs[k], l) },
			reset: func() (err error) {
				for k := range bs {
					if bs[k], err = smOf(m).CreateBacking(ctx, testGran, l); err != nil {
						return err
					}
				}
				return nil
			},
		}
	}},
	{"MapView", func(m memapi.Mechanism, l *benchLedger) workload {
		v := newViews(m, l)
		return workload{
			step: func(k int) (err error) {
				v.vs[k], err = smOf(m).MapView(ctx, v.res, chunk(k), v.bs[k], memapi.AccessReadOnly)
				return err
			},
			reset: func() error { return v.unmapAll(m, l) },
		}
	}},
	{"UnmapView", func(m memapi.Mechanism, l *benchLedger) workload {
		v := newViews(m, l)
		return workload{
			step:  func(k int) error { return smOf(m).UnmapView(ctx, v.vs[k]) },
			reset: func() error { return v.mapAll(m) },
		}
	}},
	{"CopyOnWrite", func(m memapi.Mechanism, l *benchLedger) workload {
		v := newViews(m, l)
		return workload{
			step: func(k int) (err error) {
				v.vs[k], err = smOf(m).CopyOnWrite(ctx, v.vs[k], l)
				return err
			},
			reset: func() error {
				if err := v.unmapAll(m, l); err != nil {
					return err
				}
				return v.mapAll(m)
			},
		}
	}},
	{"ViewCount", func(m memapi.Mechanism, l *benchLedger) workload {
		b, err := smOf(m).CreateBacking(ctx, testGran, l)
		if err != nil {
			panic(err)
		}
		return workload{
			step:  func(int) error { _, err := smOf(m).ViewCount(b); return err },
			reset: func() error { return nil },
		}
	}},
	{"UsedBytes", func(m memapi.Mechanism, l *benchLedger) workload {
		return workload{step: func(int) error { m.UsedBytes(); return nil }, reset: func() error { return nil }}
	}},
	{"AsVirtualBacking", func(m memapi.Mechanism, l *benchLedger) workload {
		return workload{step: func(int) error { m.AsVirtualBacking(); return nil }, reset: func() error { return nil }}
	}},
}

// TestHotPathAllocatesNothing: per method, a call through the wrapper
// allocates no more than the same call on the bare mechanism.
func TestHotPathAllocatesNothing(t *testing.T) {
	for _, target := range targets {
		for _, w := range methodWorkloads {
			t.Run(target.name+"/"+w.name, func(t *testing.T) {
				count := func(m memapi.Mechanism) float64 {
					wl := w.make(m, &benchLedger{authority: auth})
					if err := wl.reset(); err != nil {
						t.Fatal(err)
					}
					k := 0
					return testing.AllocsPerRun(batch-1, func() {
						if err := wl.step(k); err != nil {
							t.Fatal(err)
						}
						k++
					})
				}
				bare := count(target.make())
				wrapped := count(wrap(target.make(), false))
				if wrapped != bare {
					t.Fatalf("%s: %v allocs per call through the wrapper, %v bare", w.name, wrapped, bare)
				}
			})
		}
	}
}
