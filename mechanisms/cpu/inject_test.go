package cpu

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// faultWorld is what a fault-injection case runs against: an allocation, a
// reservation of four granules with the first committed and the second a
// read-write view of a backing, a reservation with one committed granule,
// and a backing mapped nowhere.
type faultWorld struct {
	alloc      *memapi.Allocation
	res, res2  *memapi.Reservation
	back, free *memapi.Backing
	view       *memapi.View
	made       []memapi.Handle // everything made, released at the end
}

const fgran = 64 * kib // the fault tests' granularity: above the page, so reservations are trimmed

func newFaultWorld(t *testing.T, m *Mechanism) *faultWorld {
	t.Helper()
	w := &faultWorld{}
	must := func(h memapi.Handle, err error) memapi.Handle {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		w.made = append(w.made, h)
		return h
	}
	w.alloc = must(m.Allocate(bg, memapi.AllocRequest{Size: 3 * 4 * kib}, g)).(*memapi.Allocation)
	w.res = must(m.Reserve(bg, memapi.ReserveRequest{Size: 4 * fgran})).(*memapi.Reservation)
	if err := m.Commit(bg, w.res, memapi.Range{Off: 0, Len: fgran}, g); err != nil {
		t.Fatal(err)
	}
	w.back = must(m.CreateBacking(bg, fgran, g)).(*memapi.Backing)
	w.view = must(m.MapView(bg, w.res, memapi.Range{Off: fgran, Len: fgran}, w.back, memapi.AccessReadWrite)).(*memapi.View)
	w.res2 = must(m.Reserve(bg, memapi.ReserveRequest{Size: fgran})).(*memapi.Reservation)
	if err := m.Commit(bg, w.res2, memapi.Range{Off: 0, Len: fgran}, g); err != nil {
		t.Fatal(err)
	}
	w.free = must(m.CreateBacking(bg, fgran, g)).(*memapi.Backing)
	return w
}

// keep records a handle an operation made, and returns its error.
func (w *faultWorld) keep(h memapi.Handle, err error) error {
	if err == nil {
		w.made = append(w.made, h)
	}
	return err
}

// release releases every live handle made: views, then backings,
// reservations and allocations.
func (w *faultWorld) release(t *testing.T, m *Mechanism) {
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

// layout is the address space over the world's reservations: each run of
// pages with the same protection and file, adjacent lines merged (a failed
// call may leave the kernel's mappings split differently, never otherwise
// changed).
func (w *faultWorld) layout(t *testing.T) []mapping {
	t.Helper()
	var out []mapping
	for _, r := range []*memapi.Reservation{w.res, w.res2} {
		start := uint64(r.Addr())
		for _, mp := range mapsCovering(t, start, start+uint64(r.Size())) {
			if n := len(out); n > 0 && out[n-1].end == mp.start && out[n-1].perms == mp.perms && out[n-1].path == mp.path {
				out[n-1].end = mp.end
				continue
			}
			out = append(out, mp)
		}
	}
	return out
}

// Every kernel call whose failure the mechanism handles, failed by
// Options.Faults, fails its operation with the mechanism's typed error (of
// the kind a real failure of that call has, the injected error and
// memapi.ErrInjected as its cause) and leaves the mechanism as it was: the
// same handles, figures and mappings, the kernel agreeing with the books.
// The operation then succeeds once the fault is gone.
func TestInjectedFaultAtEveryKernelCall(t *testing.T) {
	cases := []struct {
		op, call string
		nth      int   // the nth call of it the operation makes
		kind     error // the kind of the error for an injected EIO
		run      func(*Mechanism, *faultWorld) error
	}{
		{"DeviceAllocator.Allocate", "mmap", 1, memapi.ErrOutOfMemory, allocAligned},
		{"DeviceAllocator.Allocate", "munmap", 1, memapi.ErrOutOfMemory, allocAligned},
		{"DeviceAllocator.Allocate", "madvise", 1, memapi.ErrOutOfMemory, allocAligned},
		{"DeviceAllocator.Free", "munmap", 1, memapi.ErrInvalidRange, func(m *Mechanism, w *faultWorld) error {
			return m.Free(bg, w.alloc, nil)
		}},
		{"VirtualBacking.Reserve", "mmap", 1, memapi.ErrOutOfMemory, reserve},
		{"VirtualBacking.Reserve", "munmap", 1, memapi.ErrOutOfMemory, reserve},
		{"VirtualBacking.Commit", "mprotect", 1, memapi.ErrOutOfMemory, func(m *Mechanism, w *faultWorld) error {
			return m.Commit(bg, w.res, memapi.Range{Off: 2 * fgran, Len: 2 * fgran}, g)
		}},
		{"VirtualBacking.Commit", "madvise", 1, memapi.ErrOutOfMemory, func(m *Mechanism, w *faultWorld) error {
			return m.Commit(bg, w.res, memapi.Range{Off: 2 * fgran, Len: 2 * fgran}, g)
		}},
		{"VirtualBacking.Decommit", "mprotect", 1, memapi.ErrInvalidRange, decommit},
		{"VirtualBacking.Decommit", "madvise", 1, memapi.ErrInvalidRange, decommit},
		{"VirtualBacking.ReleaseReservation", "munmap", 1, memapi.ErrInvalidRange, func(m *Mechanism, w *faultWorld) error {
			return m.ReleaseReservation(bg, w.res2, nil)
		}},
		{"SharedMapping.CreateBacking", "memfd_create", 1, memapi.ErrOutOfMemory, createBacking},
		{"SharedMapping.CreateBacking", "ftruncate", 1, memapi.ErrOutOfMemory, createBacking},
		{"SharedMapping.CreateBacking", "fallocate", 1, memapi.ErrOutOfMemory, createBacking},
		{"SharedMapping.MapView", "mmap", 1, memapi.ErrOutOfMemory, func(m *Mechanism, w *faultWorld) error {
			return w.keep(m.MapView(bg, w.res, memapi.Range{Off: 3 * fgran, Len: fgran}, w.free, memapi.AccessReadOnly))
		}},
		{"SharedMapping.UnmapView", "mmap", 1, memapi.ErrInvalidRange, func(m *Mechanism, w *faultWorld) error {
			return m.UnmapView(bg, w.view)
		}},
		{"SharedMapping.CopyOnWrite", "memfd_create", 1, memapi.ErrOutOfMemory, copyOnWrite},
		{"SharedMapping.CopyOnWrite", "ftruncate", 1, memapi.ErrOutOfMemory, copyOnWrite},
		{"SharedMapping.CopyOnWrite", "pwrite", 1, memapi.ErrOutOfMemory, copyOnWrite},
		{"SharedMapping.CopyOnWrite", "mmap", 1, memapi.ErrOutOfMemory, copyOnWrite},
		{"SharedMapping.ReleaseBacking", "fallocate", 1, memapi.ErrInvalidRange, func(m *Mechanism, w *faultWorld) error {
			return m.ReleaseBacking(bg, w.free, nil)
		}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s/%s", c.op, c.call), func(t *testing.T) {
			var set memapi.FaultSet
			m := newMechWith(t, Options{Granularity: fgran, Faults: &set})
			w := newFaultWorld(t, m)
			defer w.release(t, m)
			stats, layout := m.Stats(), w.layout(t)
			live := make([]bool, len(w.made))
			for i, h := range w.made {
				live[i] = h.Live()
			}
			rule := memapi.Fail(unix.EIO).On(Layer, c.call).When(func(op memapi.Op) bool { return op.Args == c.op }).Nth(c.nth)
			set.Add(rule)
			err := c.run(m, w)
			if rule.Fired() != 1 {
				t.Fatalf("the fault never fired: %s makes no call %d of %s (err %v)", c.op, c.nth, c.call, err)
			}
			wantKind(t, err, c.kind)
			if !errors.Is(err, unix.EIO) || !errors.Is(err, memapi.ErrInjected) {
				t.Fatalf("%v: the cause is not the injected EIO, marked injected", err)
			}
			if got := m.Stats(); got != stats {
				t.Fatalf("the failed %s changed the mechanism: %+v -> %+v", c.op, stats, got)
			}
			for i, h := range w.made[:len(live)] {
				if h.Live() != live[i] {
					t.Fatalf("the failed %s changed whether %v is live", c.op, h)
				}
			}
			if len(w.made) != len(live) {
				t.Fatalf("the failed %s returned a handle", c.op)
			}
			if got := w.layout(t); !slices.Equal(got, layout) {
				t.Fatalf("the failed %s changed the reservations' mappings:\n%v\nwant\n%v", c.op, got, layout)
			}
			checkKernel(t, m)
			set.Clear()
			if err := c.run(m, w); err != nil {
				t.Fatalf("%s once the fault is gone: %v", c.op, err)
			}
			checkKernel(t, m)
		})
	}
}

func allocAligned(m *Mechanism, w *faultWorld) error {
	return w.keep(m.Allocate(bg, memapi.AllocRequest{Size: fgran, Align: fgran}, g))
}

func reserve(m *Mechanism, w *faultWorld) error {
	return w.keep(m.Reserve(bg, memapi.ReserveRequest{Size: 2 * fgran}))
}

func decommit(m *Mechanism, w *faultWorld) error {
	return m.Decommit(bg, w.res, memapi.Range{Off: 0, Len: fgran}, nil)
}

func createBacking(m *Mechanism, w *faultWorld) error {
	return w.keep(m.CreateBacking(bg, 2*fgran, g))
}

func copyOnWrite(m *Mechanism, w *faultWorld) error {
	v, err := m.CopyOnWrite(bg, w.view, g)
	if err == nil {
		w.made = append(w.made, v, v.Backing())
		w.view = v
	}
	return err
}

// An injected out-of-memory, as an errno or as the contract's kind, is
// ErrOutOfMemory wherever it is injected; the injector sees the call's bytes
// and the mechanism's authority.
func TestInjectedOutOfMemory(t *testing.T) {
	var trace memapi.Trace
	for _, injected := range []error{unix.ENOMEM, memapi.ErrOutOfMemory} {
		trace.Reset()
		rule := memapi.Fail(injected).On(Layer, "munmap").Nth(1)
		m := newMechWith(t, Options{Granularity: fgran, Faults: memapi.Any(&trace, rule)})
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 8 * kib}, g)
		if err != nil {
			t.Fatal(err)
		}
		err = m.Free(bg, a, nil)
		wantKind(t, err, memapi.ErrOutOfMemory)
		if !errors.Is(err, injected) || !errors.Is(err, memapi.ErrInjected) {
			t.Fatalf("%v does not wrap the injected %v", err, injected)
		}
		want := []memapi.Op{
			{Layer: Layer, Name: "mmap", Bytes: 8 * kib, Authority: DefaultAuthority, Args: "DeviceAllocator.Allocate"},
			{Layer: Layer, Name: "madvise", Bytes: 8 * kib, Authority: DefaultAuthority, Args: "DeviceAllocator.Allocate"},
			{Layer: Layer, Name: "munmap", Bytes: 8 * kib, Authority: DefaultAuthority, Args: "DeviceAllocator.Free"},
		}
		if got := trace.Ops(); !slices.Equal(got, want) {
			t.Fatalf("the injector saw %v, want %v", got, want)
		}
		if err := m.Free(bg, a, nil); err != nil {
			t.Fatal(err)
		}
	}
}
