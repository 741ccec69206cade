package plugin

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// injectWorld is what a fault-injection case runs against: an allocation,
// a reservation of four granules with the first committed and the second a
// read-write view of a backing, and a backing mapped nowhere.
type injectWorld struct {
	alloc      *memapi.Allocation
	res        *memapi.Reservation
	back, free *memapi.Backing
	view       *memapi.View
	gran       memapi.Bytes
	made       []memapi.Handle // everything made, released at the end
}

func newInjectWorld(t *testing.T, m *Mechanism) *injectWorld {
	t.Helper()
	w := &injectWorld{gran: m.Info().Granularity}
	must := func(h memapi.Handle, err error) memapi.Handle {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		w.made = append(w.made, h)
		return h
	}
	w.alloc = must(m.Allocate(bg, memapi.AllocRequest{Size: 3 * w.gran}, g)).(*memapi.Allocation)
	w.res = must(m.Reserve(bg, memapi.ReserveRequest{Size: 4 * w.gran})).(*memapi.Reservation)
	if err := m.Commit(bg, w.res, memapi.Range{Off: 0, Len: w.gran}, g); err != nil {
		t.Fatal(err)
	}
	w.back = must(m.CreateBacking(bg, w.gran, g)).(*memapi.Backing)
	w.view = must(m.MapView(bg, w.res, memapi.Range{Off: w.gran, Len: w.gran}, w.back, memapi.AccessReadWrite)).(*memapi.View)
	w.free = must(m.CreateBacking(bg, w.gran, g)).(*memapi.Backing)
	return w
}

func (w *injectWorld) keep(h memapi.Handle, err error) error {
	if err == nil {
		w.made = append(w.made, h)
	}
	return err
}

// release releases every live handle made: views, then backings,
// reservations and allocations.
func (w *injectWorld) release(t *testing.T, m *Mechanism) {
	t.Helper()
	for pass := range 4 {
		for _, h := range slices.Backward(w.made) {
			if !h.Live() {
				continue
			}
			var err error
			switch h := h.(type) {
			case *memapi.View:
				if pass == 0 {
					err = m.UnmapView(bg, h)
				}
			case *memapi.Backing:
				if pass == 1 {
					err = m.ReleaseBacking(bg, h, nil)
				}
			case *memapi.Reservation:
				if pass == 2 {
					err = m.ReleaseReservation(bg, h, nil)
				}
			case *memapi.Allocation:
				if pass == 3 {
					err = m.Free(bg, h, nil)
				}
			}
			if err != nil {
				t.Fatalf("releasing %v: %v", h, err)
			}
		}
	}
}

// Every slot, failed by Options.Faults, fails its operation as the plugin's
// own failure would (the status's kind, memapi.ErrInjected as the cause),
// without calling the plugin: the host's table, used_bytes (audited after
// every call in verify mode) and the handles are as they were, nothing is
// quarantined, and the operation succeeds once the fault is gone.
func TestInjectedFaultAtEverySlot(t *testing.T) {
	path := refhost(t)
	cases := []struct {
		op, slot string
		run      func(*Mechanism, *injectWorld) error
	}{
		{"DeviceAllocator.Allocate", "allocate", func(m *Mechanism, w *injectWorld) error {
			return w.keep(m.Allocate(bg, memapi.AllocRequest{Size: w.gran}, g))
		}},
		{"DeviceAllocator.Free", "free", func(m *Mechanism, w *injectWorld) error { return m.Free(bg, w.alloc, nil) }},
		{"VirtualBacking.Reserve", "reserve", func(m *Mechanism, w *injectWorld) error {
			return w.keep(m.Reserve(bg, memapi.ReserveRequest{Size: 2 * w.gran}))
		}},
		{"VirtualBacking.Commit", "commit", func(m *Mechanism, w *injectWorld) error {
			return m.Commit(bg, w.res, memapi.Range{Off: 2 * w.gran, Len: 2 * w.gran}, g)
		}},
		{"VirtualBacking.Decommit", "decommit", func(m *Mechanism, w *injectWorld) error {
			return m.Decommit(bg, w.res, memapi.Range{Off: 0, Len: w.gran}, nil)
		}},
		{"VirtualBacking.CommittedBytes", "committed_bytes", func(m *Mechanism, w *injectWorld) error {
			_, err := m.CommittedBytes(w.res)
			return err
		}},
		{"VirtualBacking.ReleaseReservation", "release_reservation", func(m *Mechanism, w *injectWorld) error {
			return w.keep(m.Reserve(bg, memapi.ReserveRequest{Size: w.gran})) // released by the second run only
		}},
		{"SharedMapping.CreateBacking", "create_backing", func(m *Mechanism, w *injectWorld) error {
			return w.keep(m.CreateBacking(bg, 2*w.gran, g))
		}},
		{"SharedMapping.MapView", "map_view", func(m *Mechanism, w *injectWorld) error {
			return w.keep(m.MapView(bg, w.res, memapi.Range{Off: 3 * w.gran, Len: w.gran}, w.free, memapi.AccessReadOnly))
		}},
		{"SharedMapping.UnmapView", "unmap_view", func(m *Mechanism, w *injectWorld) error { return m.UnmapView(bg, w.view) }},
		{"SharedMapping.CopyOnWrite", "copy_on_write", func(m *Mechanism, w *injectWorld) error {
			v, err := m.CopyOnWrite(bg, w.view, g)
			if err == nil {
				w.made = append(w.made, v, v.Backing())
				w.view = v
			}
			return err
		}},
		{"SharedMapping.ViewCount", "view_count", func(m *Mechanism, w *injectWorld) error {
			_, err := m.ViewCount(w.back)
			return err
		}},
		{"SharedMapping.ReleaseBacking", "release_backing", func(m *Mechanism, w *injectWorld) error {
			return m.ReleaseBacking(bg, w.free, nil)
		}},
	}
	for _, c := range cases {
		t.Run(c.op, func(t *testing.T) {
			var set memapi.FaultSet
			m, _ := newSubjectOpts(t, path, Options{Verify: true, Faults: &set})
			w := newInjectWorld(t, m)
			defer w.release(t, m)
			if c.slot == "release_reservation" { // a reservation of its own, mapped nowhere
				if err := c.run(m, w); err != nil {
					t.Fatal(err)
				}
				res := w.made[len(w.made)-1].(*memapi.Reservation)
				c.run = func(m *Mechanism, w *injectWorld) error { return m.ReleaseReservation(bg, res, nil) }
			}
			used, protocols := m.UsedBytes(), m.ProtocolErrors()
			live := make([]bool, len(w.made))
			for i, h := range w.made {
				live[i] = h.Live()
			}
			rule := memapi.Fail(memapi.ErrOutOfMemory).On(Layer, c.slot).When(func(op memapi.Op) bool { return op.Args == c.op })
			set.Add(rule)
			err := c.run(m, w)
			if rule.Fired() != 1 {
				t.Fatalf("the fault fired %d times, want once (err %v)", rule.Fired(), err)
			}
			var me *memapi.Error
			if !errors.As(err, &me) || me.Kind != memapi.ErrOutOfMemory || !errors.Is(err, memapi.ErrInjected) ||
				!strings.Contains(me.Detail, "returned MEMGEN_ERR_OUT_OF_MEMORY") || me.Mechanism != "refhost" {
				t.Fatalf("%s: got %v, want the plugin's out-of-memory, marked injected", c.op, err)
			}
			if got := m.UsedBytes(); got != used || m.Quarantined() != 0 || m.ProtocolErrors() != protocols {
				t.Fatalf("the failed %s moved the plugin: used %d -> %d, quarantined %d, protocol errors %d -> %d",
					c.op, used, got, m.Quarantined(), protocols, m.ProtocolErrors())
			}
			if len(w.made) != len(live) {
				t.Fatalf("the failed %s returned a handle", c.op)
			}
			for i, h := range w.made {
				if h.Live() != live[i] {
					t.Fatalf("the failed %s changed whether %v is live", c.op, h)
				}
			}
			set.Clear()
			if err := c.run(m, w); err != nil {
				t.Fatalf("%s once the fault is gone: %v", c.op, err)
			}
		})
	}
}

// The injector sees each slot with the call's bytes, the authority and the
// contract operation; an error of no status's kind keeps its kind, an
// *memapi.Error is the call's error as is, and a fault at open fails New.
func TestInjectorOps(t *testing.T) {
	path := refhost(t)
	var trace memapi.Trace
	errOdd := errors.New("odd")
	custom := &memapi.Error{Op: "custom", Kind: memapi.ErrUnavailable}
	set := &memapi.FaultSet{}
	set.Add(&trace)
	m, _ := newSubjectOpts(t, path, Options{Faults: set})
	gran := m.Info().Granularity
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: gran}, g)
	if err != nil {
		t.Fatal(err)
	}
	set.Add(memapi.Fail(errOdd).On(Layer, "free").Nth(1))
	if err := m.Free(bg, a, nil); !errors.Is(err, errOdd) || !errors.Is(err, memapi.ErrInjected) || !a.Live() {
		t.Fatalf("Free with an odd fault: %v (live %v)", err, a.Live())
	}
	set.Add(memapi.Fail(custom).On(Layer, "free").Nth(1))
	if err := m.Free(bg, a, nil); err != custom {
		t.Fatalf("Free with an *memapi.Error injected: %v", err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
	want := []memapi.Op{
		{Layer: Layer, Name: "open", Args: "plugin.New"},
		{Layer: Layer, Name: "allocate", Bytes: gran, Authority: "host", Args: "DeviceAllocator.Allocate"},
		{Layer: Layer, Name: "free", Authority: "host", Args: "DeviceAllocator.Free"},
		{Layer: Layer, Name: "free", Authority: "host", Args: "DeviceAllocator.Free"},
		{Layer: Layer, Name: "free", Authority: "host", Args: "DeviceAllocator.Free"},
	}
	ops := slices.DeleteFunc(trace.Ops(), func(op memapi.Op) bool { return op.Name == "stream_create" })
	if !slices.Equal(ops, want) {
		t.Fatalf("the injector saw\n%v\nwant\n%v", ops, want)
	}

	_, err = New(path, Options{Faults: memapi.Fail(memapi.ErrUnavailable).On(Layer, "open")})
	var le *LoadError
	if !errors.As(err, &le) || le.Kind != ErrBadDescriptor || !errors.Is(err, memapi.ErrUnavailable) || !errors.Is(err, memapi.ErrInjected) {
		t.Fatalf("New with open failed: %v", err)
	}
}

// An injected ErrReleased at a release is what a plugin that lost the id
// would answer: the host takes it for a protocol violation and quarantines
// the handle's bytes, which stay accounted until the instance closes.
func TestInjectedReleasedQuarantines(t *testing.T) {
	m, _ := newSubjectOpts(t, refhost(t), Options{
		Verify: true,
		Faults: memapi.Fail(memapi.ErrReleased).On(Layer, "free").Nth(1),
	})
	gran := m.Info().Granularity
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 2 * gran}, g)
	if err != nil {
		t.Fatal(err)
	}
	err = m.Free(bg, a, nil)
	if !errors.Is(err, ErrProtocol) || m.Quarantined() != 2*gran || m.UsedBytes() != 2*gran {
		t.Fatalf("Free answered ErrReleased: %v, quarantined %d, used %d", err, m.Quarantined(), m.UsedBytes())
	}
}
