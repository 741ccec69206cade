package pmm_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
	"pgregory.net/rapid"
)

// flaky wraps a mechanism and fails a call, before it reaches the
// mechanism, whenever its injector says so: fault injection at every step
// of every flow, the rollback and release steps included, over the fakes
// and the CPU mechanism alike.
type flaky struct {
	memapi.Mechanism
	inj *injector
}

// injector decides faults from a seeded source (the queue's goroutine
// asks too, so it cannot draw from rapid).
type injector struct {
	on   atomic.Bool
	mu   sync.Mutex
	rng  *rand.Rand
	rate float64
	hits atomic.Int64
}

func (in *injector) fail(method string) error {
	if !in.on.Load() {
		return nil
	}
	in.mu.Lock()
	hit := in.rng.Float64() < in.rate
	in.mu.Unlock()
	if !hit {
		return nil
	}
	in.hits.Add(1)
	return &memapi.Error{Op: "flaky." + method, Kind: memapi.ErrUnavailable, Detail: "injected fault"}
}

func (f *flaky) Allocate(ctx context.Context, req memapi.AllocRequest, g memapi.Grant) (*memapi.Allocation, error) {
	if err := f.inj.fail("Allocate"); err != nil {
		return nil, err
	}
	return f.Mechanism.Allocate(ctx, req, g)
}

func (f *flaky) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	if err := f.inj.fail("Free"); err != nil {
		return err
	}
	return f.Mechanism.Free(ctx, a, to)
}

func (f *flaky) AsVirtualBacking() (memapi.VirtualBacking, bool) {
	vb, ok := f.Mechanism.AsVirtualBacking()
	if !ok {
		return nil, false
	}
	return flakyVB{vb, f.inj}, true
}

func (f *flaky) AsSharedMapping() (memapi.SharedMapping, bool) {
	sm, ok := f.Mechanism.AsSharedMapping()
	if !ok {
		return nil, false
	}
	return flakySM{sm, f.inj}, true
}

type flakyVB struct {
	memapi.VirtualBacking
	inj *injector
}

func (f flakyVB) Reserve(ctx context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	if err := f.inj.fail("Reserve"); err != nil {
		return nil, err
	}
	return f.VirtualBacking.Reserve(ctx, req)
}

func (f flakyVB) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, g memapi.Grant) error {
	if err := f.inj.fail("Commit"); err != nil {
		return err
	}
	return f.VirtualBacking.Commit(ctx, res, r, g)
}

func (f flakyVB) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, to memapi.Account) error {
	if err := f.inj.fail("Decommit"); err != nil {
		return err
	}
	return f.VirtualBacking.Decommit(ctx, res, r, to)
}

func (f flakyVB) ReleaseReservation(ctx context.Context, res *memapi.Reservation, to memapi.Account) error {
	if err := f.inj.fail("ReleaseReservation"); err != nil {
		return err
	}
	return f.VirtualBacking.ReleaseReservation(ctx, res, to)
}

type flakySM struct {
	memapi.SharedMapping
	inj *injector
}

func (f flakySM) CreateBacking(ctx context.Context, size memapi.Bytes, g memapi.Grant) (*memapi.Backing, error) {
	if err := f.inj.fail("CreateBacking"); err != nil {
		return nil, err
	}
	return f.SharedMapping.CreateBacking(ctx, size, g)
}

func (f flakySM) MapView(ctx context.Context, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, a memapi.Access) (*memapi.View, error) {
	if err := f.inj.fail("MapView"); err != nil {
		return nil, err
	}
	return f.SharedMapping.MapView(ctx, res, r, b, a)
}

func (f flakySM) UnmapView(ctx context.Context, v *memapi.View) error {
	if err := f.inj.fail("UnmapView"); err != nil {
		return err
	}
	return f.SharedMapping.UnmapView(ctx, v)
}

func (f flakySM) CopyOnWrite(ctx context.Context, v *memapi.View, g memapi.Grant) (*memapi.View, error) {
	if err := f.inj.fail("CopyOnWrite"); err != nil {
		return nil, err
	}
	return f.SharedMapping.CopyOnWrite(ctx, v, g)
}

func (f flakySM) ReleaseBacking(ctx context.Context, b *memapi.Backing, to memapi.Account) error {
	if err := f.inj.fail("ReleaseBacking"); err != nil {
		return err
	}
	return f.SharedMapping.ReleaseBacking(ctx, b, to)
}

// testFence is a fence the model completes, in any order.
type testFence struct {
	ch   chan struct{}
	once sync.Once
}

func (f *testFence) Done() bool {
	select {
	case <-f.ch:
		return true
	default:
		return false
	}
}
func (f *testFence) Ready() <-chan struct{} { return f.ch }
func (f *testFence) Wait(ctx context.Context) error {
	select {
	case <-f.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (f *testFence) complete() { f.once.Do(func() { close(f.ch) }) }

// backend is one mechanism family under test.
type backend struct {
	name string
	gran memapi.Bytes
	// mech makes a new instance accounting to authority.
	mech func(t *rapid.T) (m memapi.Mechanism, used func() memapi.Bytes, kernel func() (memapi.Bytes, error))
	// dev makes the device context of the first instance.
	dev func(m memapi.Mechanism) memapi.DeviceContext
}

const modelAuth = memapi.AuthorityID("model")

// discard drops the queue's reports of the failed frees the model injects.
var discard = slog.New(slog.DiscardHandler)

var modelOps, holeOps atomic.Int64

func fakesBackend() backend {
	return backend{name: "fakes", gran: gran,
		mech: func(*rapid.T) (memapi.Mechanism, func() memapi.Bytes, func() (memapi.Bytes, error)) {
			m := fakes.NewMechanism(fakes.Config{Authority: modelAuth})
			return m, m.UsedBytes, nil
		},
		dev: func(m memapi.Mechanism) memapi.DeviceContext { return fakes.NewContext(m.(*fakes.Mechanism)) },
	}
}

func cpuBackend() backend {
	return backend{name: "cpu", gran: 4096,
		mech: func(t *rapid.T) (memapi.Mechanism, func() memapi.Bytes, func() (memapi.Bytes, error)) {
			m, err := cpu.New(cpu.Options{Granularity: 4096, Authority: modelAuth})
			if err != nil {
				t.Fatal(err)
			}
			return m, m.UsedBytes, m.KernelBytes
		},
		dev: func(m memapi.Mechanism) memapi.DeviceContext { return cpu.NewContext(m.(*cpu.Mechanism)) },
	}
}

// TestManagerModelFakes and TestManagerModelCPU run random batches of
// Allocate, ReserveVirtual, CreateShared, Grow, Shrink, MapShared,
// CopyOnWrite, Decommit and Commit of holes and of sparse ranges above the length, RecordUse, Close, Retry, Replace, drops left to the backstop
// and garbage collections, each batch issued from up to three goroutines at
// once on shared handles (so Close races transactions), with faults
// injected at a random rate into every mechanism call, rollback and release
// steps included, and fences completed in any order. After every batch the
// ledger must equal what the mechanisms hold and every goroutine must have
// returned; at quiescence (faults off, fences complete, every handle
// closed or collected, quarantined releases retried, the queue drained)
// nothing is charged or held (the kernel agrees on the CPU), the context is
// unpinned, and the manager and context close.
func TestManagerModelFakes(t *testing.T) { runModel(t, fakesBackend(), 90) }

func TestManagerModelCPU(t *testing.T) { runModel(t, cpuBackend(), 70) }

func runModel(t *testing.T, be backend, batches int) {
	start, holes := modelOps.Load(), holeOps.Load()
	rapid.Check(t, func(rt *rapid.T) {
		m := newPModel(rt, be)
		defer m.teardown()
		n := rapid.IntRange(batches/2, batches).Draw(rt, "batches")
		for i := 0; i < n; i++ {
			m.batch(rt)
			m.identity(rt)
		}
		m.quiesce(rt)
	})
	t.Logf("%s: %d operations, %d successful decommits and commits of holes", be.name, modelOps.Load()-start, holeOps.Load()-holes)
	if holeOps.Load() == holes {
		t.Error("no Decommit or Commit of a hole succeeded: the holes were not exercised")
	}
}

type mhandle struct {
	buf *pmm.Buffer
	r   *pmm.Region
	sh  *pmm.Shared
}

func (h *mhandle) owned() *ep.Owned {
	switch {
	case h.buf != nil:
		return &h.buf.Owned
	case h.r != nil:
		return &h.r.Owned
	}
	return &h.sh.Owned
}

type tracked struct {
	kind string
	o    weak.Pointer[ep.Lifecycle]
}

type pmodel struct {
	be     backend
	inj    *injector
	g      *governor.Governor
	mgr    *pmm.Manager
	ectx   *ep.Context
	bind   *pmm.Binding
	used   []func() memapi.Bytes
	kernel []func() (memapi.Bytes, error)

	handles []*mhandle
	focus   *mhandle  // the handle every call of a batch targets, if set
	all     []tracked // every handle made, weakly, for the failure report
	fences  []*testFence
	closed  bool
}

func newPModel(rt *rapid.T, be backend) *pmodel {
	m := &pmodel{be: be, inj: &injector{
		rng:  rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 1)),
		rate: rapid.SampledFrom([]float64{0, 0.05, 0.2}).Draw(rt, "fault rate"),
	}}
	m.g = governor.New(governor.Options{})
	if err := m.g.AddAuthority(modelAuth, 1<<40); err != nil {
		rt.Fatal(err)
	}
	if err := m.g.Register("h", nil, governor.HolderOptions{}); err != nil {
		rt.Fatal(err)
	}
	mech := m.newMech(rt)
	m.ectx = ep.NewContext(be.dev(mech.(*flaky).Mechanism), ep.Options{Logger: discard})
	m.mgr = pmm.New(m.g, pmm.Options{Verify: true})
	if err := m.mgr.Register(pmm.Device{Key: dev0, Mechanism: mech, Context: m.ectx, Authority: modelAuth}); err != nil {
		rt.Fatal(err)
	}
	var err error
	if m.bind, err = m.mgr.Bind("h", "kv", dev0); err != nil {
		rt.Fatal(err)
	}
	m.inj.on.Store(true)
	return m
}

func (m *pmodel) newMech(rt *rapid.T) memapi.Mechanism {
	inner, used, kernel := m.be.mech(rt)
	m.used = append(m.used, used)
	if kernel != nil {
		m.kernel = append(m.kernel, kernel)
	}
	return &flaky{Mechanism: inner, inj: m.inj}
}

// op is one call, prepared on the test's goroutine (rapid draws only
// there) and run on its own.
type op struct {
	name string
	run  func(ctx context.Context) (*mhandle, error)
}

func (m *pmodel) pick(rt *rapid.T, ok func(*mhandle) bool) *mhandle {
	if m.focus != nil && ok(m.focus) {
		return m.focus
	}
	var c []*mhandle
	for _, h := range m.handles {
		if ok(h) {
			c = append(c, h)
		}
	}
	if len(c) == 0 {
		return nil
	}
	return c[rapid.IntRange(0, len(c)-1).Draw(rt, "handle")]
}

func isRegion(h *mhandle) bool { return h.r != nil }
func isShared(h *mhandle) bool { return h.sh != nil }
func anyHandle(*mhandle) bool  { return true }

func (m *pmodel) prepare(rt *rapid.T) op {
	gr := m.be.gran
	size := func(maxUnits int) memapi.Bytes {
		return memapi.Bytes(rapid.IntRange(1, maxUnits*int(gr)).Draw(rt, "bytes"))
	}
	b := m.bind
	switch name := rapid.SampledFrom([]string{"allocate", "reserve", "shared", "grow", "grow", "shrink", "map", "cow",
		"decommit", "decommit", "commit", "commit",
		"record", "close", "retry", "drop", "fence", "fence", "replace", "gc"}).Draw(rt, "op"); name {
	case "allocate":
		n := size(3)
		return op{name, func(ctx context.Context) (*mhandle, error) {
			buf, err := b.Allocate(ctx, n)
			if err != nil {
				return nil, err
			}
			return &mhandle{buf: buf}, nil
		}}
	case "reserve":
		n := memapi.Bytes(rapid.IntRange(1, 12).Draw(rt, "granules")) * gr
		return op{name, func(ctx context.Context) (*mhandle, error) {
			r, err := b.ReserveVirtual(ctx, n)
			if err != nil {
				return nil, err
			}
			return &mhandle{r: r}, nil
		}}
	case "shared":
		n := size(2)
		return op{name, func(ctx context.Context) (*mhandle, error) {
			sh, err := b.CreateShared(ctx, n)
			if err != nil {
				return nil, err
			}
			return &mhandle{sh: sh}, nil
		}}
	case "grow", "shrink":
		h := m.pick(rt, isRegion)
		if h == nil {
			break
		}
		n := memapi.Bytes(rapid.IntRange(0, int(h.r.Cap())).Draw(rt, "len"))
		// A slow holder widens the window in which a Close or another
		// transaction of the batch lands inside this one.
		slow := rapid.Bool().Draw(rt, "slow holder")
		refuse := rapid.IntRange(0, 3).Draw(rt, "holder refuses") == 0 // its update fails: the rollback runs
		return op{name, func(ctx context.Context) (*mhandle, error) {
			var view memapi.Bytes
			calls := 0
			update := func(l memapi.Bytes) error {
				if slow {
					time.Sleep(300 * time.Microsecond)
				}
				calls++
				if refuse && calls == 1 {
					return &memapi.Error{Op: "model.update", Kind: memapi.ErrInUse, Detail: "the holder refuses"}
				}
				view = l
				return nil
			}
			before := h.r.Len()
			var err error
			if name == "grow" {
				err = h.r.Grow(ctx, n, update)
			} else {
				err = h.r.Shrink(ctx, n, update)
			}
			if err == nil && name == "grow" && n > before && view != n {
				return nil, fmt.Errorf("grow succeeded but the holder's view is %d, not %d", view, n)
			}
			return nil, err
		}}
	case "decommit", "commit":
		// A granule-aligned range inside the region's length (at the
		// time the op runs, which a concurrent Shrink may cut: then a
		// Decommit is ErrInvalidRange), often across pieces of several
		// commits; one time in ten anywhere in the reservation (a Commit
		// there is sparse: it raises the length).
		h := m.pick(rt, isRegion)
		if h == nil {
			break
		}
		units := int(h.r.Len() / gr)
		if units == 0 || rapid.IntRange(0, 9).Draw(rt, "anywhere") == 0 {
			units = int(h.r.Cap() / gr)
		}
		off := rapid.IntRange(0, units-1).Draw(rt, "granule")
		n := rapid.IntRange(1, min(3, units-off)).Draw(rt, "granules")
		rng := memapi.Range{Off: memapi.Bytes(off) * gr, Len: memapi.Bytes(n) * gr}
		return op{name, func(ctx context.Context) (*mhandle, error) {
			var err error
			if name == "decommit" {
				err = h.r.Decommit(ctx, rng)
			} else {
				err = h.r.Commit(ctx, rng)
			}
			if err == nil {
				holeOps.Add(1)
			}
			return nil, err
		}}
	case "map":
		r, sh := m.pick(rt, isRegion), m.pick(rt, isShared)
		if r == nil || sh == nil {
			break
		}
		access := rapid.SampledFrom([]memapi.Access{memapi.AccessReadOnly, memapi.AccessReadWrite}).Draw(rt, "access")
		return op{name, func(ctx context.Context) (*mhandle, error) {
			_, err := r.r.MapShared(ctx, sh.sh, access)
			return nil, err
		}}
	case "cow":
		h := m.pick(rt, isRegion)
		if h == nil {
			break
		}
		off := memapi.Bytes(rapid.IntRange(0, int(h.r.Cap())-1).Draw(rt, "offset"))
		return op{name, func(ctx context.Context) (*mhandle, error) { return nil, h.r.CopyOnWrite(ctx, off) }}
	case "record":
		h := m.pick(rt, anyHandle)
		if h == nil {
			break
		}
		f := &testFence{ch: make(chan struct{})}
		m.fences = append(m.fences, f)
		return op{name, func(context.Context) (*mhandle, error) { return nil, h.owned().RecordUse(f) }}
	case "close":
		h := m.pick(rt, anyHandle)
		if h == nil {
			break
		}
		return op{name, func(context.Context) (*mhandle, error) { return nil, h.owned().Close() }}
	case "retry":
		h := m.pick(rt, anyHandle)
		if h == nil {
			break
		}
		return op{name, func(ctx context.Context) (*mhandle, error) {
			if h.r != nil {
				return nil, h.r.Retry(ctx)
			}
			return nil, h.owned().Retry()
		}}
	case "drop":
		if len(m.handles) == 0 {
			break
		}
		i := rapid.IntRange(0, len(m.handles)-1).Draw(rt, "drop")
		m.handles[i] = m.handles[len(m.handles)-1]
		m.handles[len(m.handles)-1] = nil
		m.handles = m.handles[:len(m.handles)-1]
	case "fence":
		if len(m.fences) == 0 {
			break
		}
		i := rapid.IntRange(0, len(m.fences)-1).Draw(rt, "fence")
		f := m.fences[i]
		m.fences = append(m.fences[:i], m.fences[i+1:]...)
		return op{name, func(context.Context) (*mhandle, error) { f.complete(); return nil, nil }}
	case "replace":
		if len(m.used) >= 3 {
			break
		}
		mech := m.newMech(rt)
		return op{name, func(context.Context) (*mhandle, error) { return nil, m.mgr.Replace(dev0, mech) }}
	case "gc":
		return op{name, func(context.Context) (*mhandle, error) { runtime.GC(); return nil, nil }}
	}
	return op{"noop", func(context.Context) (*mhandle, error) { return nil, nil }}
}

// batch runs up to three prepared calls at once and checks that each
// returned, with nil or a typed error.
func (m *pmodel) batch(rt *rapid.T) {
	k := rapid.IntRange(1, 3).Draw(rt, "goroutines")
	m.focus = nil
	if k > 1 && rapid.Bool().Draw(rt, "one handle") {
		m.focus = m.pick(rt, isRegion) // Close racing transactions on it
	}
	ops := make([]op, k)
	for i := range ops {
		ops[i] = m.prepare(rt)
	}
	type res struct {
		h   *mhandle
		err error
		op  string
	}
	out := make(chan res, k)
	for _, o := range ops {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			defer cancel()
			h, err := o.run(ctx)
			out <- res{h, err, o.name}
		}()
	}
	m.focus = nil // a dropped handle must be unreachable for the backstop
	stuck := time.After(watchdog.Bound)
	for range ops {
		select {
		case r := <-out:
			modelOps.Add(1)
			if r.h != nil {
				m.handles = append(m.handles, r.h)
				kind := map[bool]string{true: "buffer", false: "region"}[r.h.buf != nil]
				if r.h.sh != nil {
					kind = "shared"
				}
				m.all = append(m.all, tracked{kind, weak.Make(r.h.owned().Lifecycle())})
			}
			var me *memapi.Error
			if r.err != nil && !errors.As(r.err, &me) {
				rt.Fatalf("%s: untyped error %v", r.op, r.err)
			}
		case <-stuck:
			rt.Fatalf("watchdog: a goroutine is blocked after %v (ops %v)", watchdog.Bound, ops)
		}
	}
}

// identity checks the ledger against the mechanisms. Releases whose fences
// completed may be running on the queue, so it waits (bounded) for the two
// to meet; a difference that stays is a lost byte.
func (m *pmodel) identity(rt *rapid.T) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, _ := m.g.Authority(modelAuth)
		var used memapi.Bytes
		for _, u := range m.used {
			used += u()
		}
		if s.Balanced() && s.Reserved == 0 && s.Charged+s.Pending == used && s.Quarantined <= s.Charged {
			return
		}
		if time.Now().After(deadline) {
			rt.Fatalf("ledger %+v, mechanisms hold %d", s, used)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// quiesce turns faults off, completes every fence, closes every handle
// (retrying quarantined ones), lets the backstop collect the dropped ones,
// and checks that nothing is left.
func (m *pmodel) quiesce(rt *rapid.T) {
	m.inj.on.Store(false)
	for _, f := range m.fences {
		f.complete()
	}
	m.fences = nil
	for _, h := range m.handles {
		if err := h.owned().Close(); err != nil {
			rt.Fatalf("close at quiescence: %v", err)
		}
	}
	m.handles = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for m.ectx.Live() > 0 && ctx.Err() == nil {
		runtime.GC()
		if err := m.ectx.RetryQuarantined(); err != nil {
			rt.Fatal(err)
		}
		_ = m.ectx.Queue().Drain(ctx)
		time.Sleep(time.Millisecond)
	}
	if n := m.ectx.Live(); n != 0 {
		var left []string
		for _, x := range m.all {
			if l := x.o.Value(); l != nil && l.State() != ep.Released {
				left = append(left, fmt.Sprintf("%s %v holds=%d", x.kind, l.State(), l.Holds()))
			}
		}
		rt.Fatalf("%d handles still pinned (%d quarantined: %v); not released: %v", n, m.ectx.Quarantined(), m.ectx.QuarantineErrors(), left)
	}
	m.identity(rt)
	s, _ := m.g.Authority(modelAuth)
	if s.Charged != 0 || s.Pending != 0 || s.Reserved != 0 || s.Quarantined != 0 {
		rt.Fatalf("at quiescence %+v", s)
	}
	for _, k := range m.kernel {
		if n, err := k(); err != nil || n != 0 {
			rt.Fatalf("the kernel reports %d bytes held (%v)", n, err)
		}
	}
	if n := m.bind.Live(); n != 0 {
		rt.Fatalf("binding counts %d live handles", n)
	}
	if err := m.mgr.Close(ctx); err != nil {
		rt.Fatal(err)
	}
	if err := m.ectx.Close(ctx, false); err != nil {
		rt.Fatal(err)
	}
	m.closed = true
}

// teardown releases what a failed run left, so the next one (and goleak)
// starts clean.
func (m *pmodel) teardown() {
	if !m.closed {
		m.inj.on.Store(false)
		for _, f := range m.fences {
			f.complete()
		}
		for _, h := range m.handles {
			_ = h.owned().Close()
		}
		m.handles = nil
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for m.ectx.Live() > 0 && ctx.Err() == nil {
			runtime.GC()
			_ = m.ectx.RetryQuarantined()
			_ = m.ectx.Queue().Drain(ctx)
			time.Sleep(time.Millisecond)
		}
		_ = m.ectx.Close(ctx, true)
		cancel()
	}
	_ = m.g.Close()
}
