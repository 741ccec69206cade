package pmm_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var dev0 = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 0}

const auth = memapi.AuthorityID("dev")

type env struct {
	mgr  *pmm.Manager
	l    *faults
	m    *fakes.Mechanism
	fctx *fakes.Context
	ectx *ep.Context
	rec  *fakes.Recorder
}

func setup(t *testing.T, cfg fakes.Config) *env {
	t.Helper()
	cfg.Authority = auth
	if cfg.Recorder == nil {
		cfg.Recorder = fakes.NewRecorder()
	}
	m := fakes.NewMechanism(cfg)
	fctx := fakes.NewContext(m)
	ectx := ep.NewContext(fctx, ep.Options{})
	g, l := newFaulty(auth)
	t.Cleanup(func() { g.Close() })
	mgr := pmm.New(g, pmm.Options{Verify: true})
	require.NoError(t, mgr.Register(pmm.Device{Key: dev0, Mechanism: m, Context: ectx, Authority: auth}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, ectx.Close(ctx, true))
	})
	return &env{mgr: mgr, l: l, m: m, fctx: fctx, ectx: ectx, rec: cfg.Recorder}
}

func (e *env) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, e.ectx.Queue().Drain(ctx))
}

// bind binds holder in role to dev0.
func (e *env) bind(t *testing.T, holder, role string) *pmm.Binding {
	t.Helper()
	b, err := e.mgr.Bind(holder, role, dev0)
	require.NoError(t, err)
	return b
}

// region binds the holder "kv" in role "cache" to dev0 and reserves a
// region of size bytes through it.
func (e *env) region(t *testing.T, size memapi.Bytes) (*pmm.Binding, *pmm.Region) {
	t.Helper()
	b := e.bind(t, "kv", "cache")
	r, err := b.ReserveVirtual(context.Background(), size)
	require.NoError(t, err)
	return b, r
}

// state is everything a failed transaction must leave as it was.
type state struct {
	ledger figures
	used   memapi.Bytes
	live   int
}

func (e *env) state(b *pmm.Binding) state {
	return state{ledger: e.l.snapshot(), used: e.m.UsedBytes(), live: b.Live()}
}

func (e *env) fence(t *testing.T) *fakes.Fence {
	t.Helper()
	s, err := e.fctx.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	f, err := s.Record()
	require.NoError(t, err)
	return f.(*fakes.Fence)
}

func TestAllocateChargesTheRoundedSize(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "weights", "model")
	buf, err := b.Allocate(context.Background(), 5000)
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(8192), buf.Size())
	require.Equal(t, figures{Charged: 8192}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(8192), e.m.UsedBytes())
	require.NoError(t, buf.Close())
	e.drain(t)
	require.Equal(t, figures{}, e.l.snapshot())
	require.Zero(t, e.m.UsedBytes())
	require.NoError(t, b.Close())
}

// The release flow: no free before the fence completes, no refund before the
// free, in that order.
func TestReleaseFlowOrder(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	b := e.bind(t, "kv", "cache")
	buf, err := b.Allocate(context.Background(), 1<<16)
	require.NoError(t, err)

	f := e.fence(t)
	var order []string
	e.l.onEvent = func(ev string) {
		switch ev {
		case "pending":
			order = append(order, "pending")
		case "refund":
			// Called with the ledger's lock held; the fake's state is its own.
			require.True(t, f.Done(), "refund before the fence completed")
			require.Equal(t, 1, e.m.FreeCallCount(), "refund before the free")
			order = append(order, "refund")
		}
	}
	require.NoError(t, buf.RecordUse(f))
	require.NoError(t, buf.Close())
	require.Equal(t, figures{Pending: 1 << 16}, e.l.snapshot(), "Close marks the lease pending-free")
	time.Sleep(10 * time.Millisecond)
	require.Zero(t, e.m.FreeCallCount(), "freed before the fence completed")

	f.Complete()
	e.drain(t)
	require.Equal(t, 1, e.m.FreeCallCount())
	require.Equal(t, []string{"pending", "refund"}, order)
	require.Equal(t, figures{}, e.l.snapshot())

	// The recorded calls show the fence completing before the free.
	var seqComplete, seqFree uint64
	for _, c := range e.rec.Calls() {
		switch c.Method {
		case "Complete":
			seqComplete = c.Seq
		case "Free":
			seqFree = c.Seq
		}
	}
	if seqComplete != 0 { // the fake records fence completion when it has a record for it
		require.Less(t, seqComplete, seqFree)
	}
	require.NotZero(t, seqFree)
}

func TestAllocateFaultsLeaveNoTrace(t *testing.T) {
	boom := errors.New("boom")
	steps := []struct {
		name   string
		inject func(e *env)
		want   error
	}{
		{"reserve", func(e *env) { e.l.failReserve = e.l.reserves + 1 }, errInjected},
		{"allocate", func(e *env) { e.m.Inject(fakes.Fault{Method: "Allocate", Err: boom}) }, boom},
		{"out-of-memory", func(e *env) { e.m.Inject(fakes.Fault{Method: "Allocate", Err: memapi.ErrOutOfMemory}) }, memapi.ErrOutOfMemory},
		{"commit-grant", func(e *env) { e.l.failCommit = e.l.commits + 1 }, errInjected},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			b := e.bind(t, "h", "r")
			keep, err := b.Allocate(context.Background(), 4096) // some prior state
			require.NoError(t, err)
			before := e.state(b)
			st.inject(e)
			_, err = b.Allocate(context.Background(), 3*4096)
			require.ErrorIs(t, err, st.want)
			e.m.ClearFaults()
			require.Equal(t, before, e.state(b))
			require.NoError(t, keep.Close())
			e.drain(t)
			require.Equal(t, figures{}, e.l.snapshot())
			require.Zero(t, e.m.UsedBytes())
		})
	}
	t.Run("closed-context", func(t *testing.T) {
		e := setup(t, fakes.Config{})
		b := e.bind(t, "h", "r")
		require.NoError(t, e.ectx.Close(context.Background(), false))
		before := e.state(b)
		_, err := b.Allocate(context.Background(), 4096)
		require.ErrorIs(t, err, memapi.ErrClosed)
		require.Equal(t, before, e.state(b))
	})
}

// view is a holder's view of a KV region: the length it may use.
type view struct{ len memapi.Bytes }

func (v *view) update(n memapi.Bytes) error { v.len = n; return nil }

func TestGrowAndShrink(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	b, r := e.region(t, 16*65536)
	addr := r.Addr()
	var v view
	require.NoError(t, r.Grow(ctx, 100_000, v.update))
	require.Equal(t, memapi.Bytes(100_000), v.len)
	require.Equal(t, memapi.Bytes(2*65536), r.Len())
	require.NoError(t, r.Grow(ctx, 5*65536, v.update))
	require.Equal(t, figures{Charged: 5 * 65536}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(5*65536), e.m.UsedBytes())
	require.Equal(t, addr, r.Addr(), "the address never moves")

	// Shrink behind a fence: pending until it completes, then refunded.
	f := e.fence(t)
	require.NoError(t, r.RecordUse(f))
	require.NoError(t, r.Shrink(ctx, 65536+1, v.update))
	require.Equal(t, memapi.Bytes(2*65536), r.Len())
	require.Equal(t, figures{Charged: 2 * 65536, Pending: 3 * 65536}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(5*65536), e.m.UsedBytes(), "decommitted before the fence completed")
	f.Complete()
	e.drain(t)
	require.Equal(t, figures{Charged: 2 * 65536}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(2*65536), e.m.UsedBytes())

	// Grow again into the drained range.
	require.NoError(t, r.Grow(ctx, 3*65536, v.update))
	require.Equal(t, memapi.Bytes(3*65536), e.m.UsedBytes())

	require.ErrorIs(t, b.Close(), memapi.ErrInUse, "binding closed with a live region")
	require.NoError(t, r.Close())
	e.drain(t)
	require.Equal(t, figures{}, e.l.snapshot())
	require.Zero(t, e.m.UsedBytes())
	require.NoError(t, b.Close())
}

func TestGrowFaultsLeaveNoTrace(t *testing.T) {
	boom := errors.New("boom")
	steps := []struct {
		name   string
		inject func(e *env, v *view) func(memapi.Bytes) error
		want   error
	}{
		{"reserve", func(e *env, v *view) func(memapi.Bytes) error { e.l.failReserve = e.l.reserves + 1; return v.update }, errInjected},
		{"commit-range", func(e *env, v *view) func(memapi.Bytes) error {
			e.m.Inject(fakes.Fault{Method: "Commit", Err: memapi.ErrOutOfMemory})
			return v.update
		}, memapi.ErrOutOfMemory},
		{"holder-update", func(e *env, v *view) func(memapi.Bytes) error {
			return func(memapi.Bytes) error { return boom }
		}, boom},
		{"commit-charge", func(e *env, v *view) func(memapi.Bytes) error { e.l.failCommit = e.l.commits + 1; return v.update }, errInjected},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			b := e.bind(t, "kv", "cache")
			ctx := context.Background()
			r, err := b.ReserveVirtual(ctx, 8*65536)
			require.NoError(t, err)
			var v view
			require.NoError(t, r.Grow(ctx, 2*65536, v.update))
			before, beforeLen, beforeView := e.state(b), r.Len(), v
			upd := st.inject(e, &v)
			err = r.Grow(ctx, 5*65536, upd)
			require.ErrorIs(t, err, st.want)
			e.m.ClearFaults()
			require.Equal(t, before, e.state(b))
			require.Equal(t, beforeLen, r.Len())
			require.Equal(t, beforeView, v, "the holder's view changed")
			// The region still works.
			require.NoError(t, r.Grow(ctx, 3*65536, v.update))
			require.NoError(t, r.Close())
			e.drain(t)
			require.Equal(t, figures{}, e.l.snapshot())
			require.Zero(t, e.m.UsedBytes())
		})
	}
}

func TestReserveVirtualUnsupported(t *testing.T) {
	e := setup(t, fakes.Config{Offers: memapi.Of(memapi.CapDeviceAllocator)})
	b := e.bind(t, "kv", "cache")
	caps, err := b.Capabilities()
	require.NoError(t, err)
	require.False(t, caps.Has(memapi.CapVirtualBacking))
	_, err = b.ReserveVirtual(context.Background(), 1<<20)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.Zero(t, b.Live())
	_, err = b.CreateShared(context.Background(), 1<<16)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	require.Equal(t, figures{}, e.l.snapshot())
}

func TestSharedPrefix(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	sys := e.bind(t, "prefix", "kv")
	kv := e.bind(t, "requests", "kv")

	sh, err := sys.CreateShared(ctx, 2*65536)
	require.NoError(t, err)
	// Write the prefix once through a read-write view.
	w, err := kv.ReserveVirtual(ctx, 4*65536)
	require.NoError(t, err)
	wr, err := w.MapShared(ctx, sh, memapi.AccessReadWrite)
	require.NoError(t, err)
	prefix := bytes.Repeat([]byte("sys-prompt"), 13108)[:2*65536]
	copyIn(t, e, w.Addr()+memapi.DeviceAddr(wr.Off), prefix)

	var regions []*pmm.Region
	for i := 0; i < 3; i++ {
		r, err := kv.ReserveVirtual(ctx, 4*65536)
		require.NoError(t, err)
		rng, err := r.MapShared(ctx, sh, memapi.AccessReadOnly)
		require.NoError(t, err)
		require.Equal(t, memapi.Range{Off: 0, Len: 2 * 65536}, rng)
		require.NoError(t, r.Grow(ctx, 3*65536, nil)) // private tail after the prefix
		regions = append(regions, r)
	}
	require.Equal(t, 4, sh.Views())
	require.Equal(t, memapi.Bytes(2*65536+3*65536), e.m.UsedBytes(), "the prefix is held once")
	require.Equal(t, figures{Charged: 2*65536 + 3*65536}, e.l.snapshot())
	got := copyOut(t, e, regions[1].Addr(), len(prefix))
	require.Equal(t, prefix, got, "views share the bytes")

	// A read-only view refuses writes through the context.
	require.ErrorIs(t, tryCopyIn(e, regions[0].Addr(), []byte("x")), memapi.ErrReadOnly)

	// Copy-on-write: a private, charged copy; other views unchanged.
	require.NoError(t, regions[0].CopyOnWrite(ctx, 0))
	require.Equal(t, figures{Charged: 4*65536 + 3*65536}, e.l.snapshot())
	copyIn(t, e, regions[0].Addr(), []byte("private!"))
	require.Equal(t, []byte("private!"), copyOut(t, e, regions[0].Addr(), 8))
	require.Equal(t, prefix[:8], copyOut(t, e, regions[1].Addr(), 8))
	require.Equal(t, 3, sh.Views())

	// Closing the owner keeps the backing while views remain.
	require.NoError(t, sh.Close())
	require.NoError(t, w.Close())
	for _, r := range regions {
		require.NoError(t, r.Close())
	}
	e.drain(t)
	require.Equal(t, figures{}, e.l.snapshot())
	require.Zero(t, e.m.UsedBytes())
	require.NoError(t, sys.Close())
	require.NoError(t, kv.Close())
}

func TestSharedFaultsLeaveNoTrace(t *testing.T) {
	boom := errors.New("boom")
	type step struct {
		name   string
		inject func(e *env)
		want   error
	}
	for _, st := range []step{
		{"reserve", func(e *env) { e.l.failReserve = e.l.reserves + 1 }, errInjected},
		{"create-backing", func(e *env) { e.m.Inject(fakes.Fault{Method: "CreateBacking", Err: boom}) }, boom},
		{"commit-grant", func(e *env) { e.l.failCommit = e.l.commits + 1 }, errInjected},
	} {
		t.Run("create/"+st.name, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			b := e.bind(t, "p", "kv")
			before := e.state(b)
			st.inject(e)
			_, err := b.CreateShared(context.Background(), 65536)
			require.ErrorIs(t, err, st.want)
			e.m.ClearFaults()
			require.Equal(t, before, e.state(b))
			require.Zero(t, e.ectx.Live())
		})
	}
	for _, st := range []step{
		{"map", func(e *env) { e.m.Inject(fakes.Fault{Method: "MapView", Err: boom}) }, boom},
	} {
		t.Run("map/"+st.name, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			ctx := context.Background()
			b := e.bind(t, "p", "kv")
			sh, err := b.CreateShared(ctx, 65536)
			require.NoError(t, err)
			r, err := b.ReserveVirtual(ctx, 4*65536)
			require.NoError(t, err)
			before, views := e.state(b), sh.Views()
			st.inject(e)
			_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
			require.ErrorIs(t, err, st.want)
			e.m.ClearFaults()
			require.Equal(t, before, e.state(b))
			require.Equal(t, views, sh.Views())
			require.Zero(t, r.Len())
			require.NoError(t, r.Close())
			require.NoError(t, sh.Close())
			e.drain(t)
			require.Equal(t, figures{}, e.l.snapshot())
		})
	}
	for _, st := range []step{
		{"reserve", func(e *env) { e.l.failReserve = e.l.reserves + 1 }, errInjected},
		{"copy-on-write", func(e *env) { e.m.Inject(fakes.Fault{Method: "CopyOnWrite", Err: memapi.ErrOutOfMemory}) }, memapi.ErrOutOfMemory},
		{"commit-grant", func(e *env) { e.l.failCommit = e.l.commits + 1 }, errInjected},
	} {
		t.Run("cow/"+st.name, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			ctx := context.Background()
			b := e.bind(t, "p", "kv")
			sh, err := b.CreateShared(ctx, 65536)
			require.NoError(t, err)
			w, err := b.ReserveVirtual(ctx, 65536)
			require.NoError(t, err)
			_, err = w.MapShared(ctx, sh, memapi.AccessReadWrite)
			require.NoError(t, err)
			copyIn(t, e, w.Addr(), []byte("shared"))
			r, err := b.ReserveVirtual(ctx, 4*65536)
			require.NoError(t, err)
			_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
			require.NoError(t, err)
			before, views := e.state(b), sh.Views()
			st.inject(e)
			err = r.CopyOnWrite(ctx, 0)
			require.ErrorIs(t, err, st.want)
			e.m.ClearFaults()
			require.Equal(t, before, e.state(b))
			require.Equal(t, views, sh.Views())
			require.Equal(t, []byte("shared"), copyOut(t, e, r.Addr(), 6), "the region lost its shared view")
			require.ErrorIs(t, tryCopyIn(e, r.Addr(), []byte("x")), memapi.ErrReadOnly, "the view is no longer read-only")
			for _, c := range []interface{ Close() error }{r, w, sh} {
				require.NoError(t, c.Close())
			}
			e.drain(t)
			require.Equal(t, figures{}, e.l.snapshot())
			require.Zero(t, e.m.UsedBytes())
		})
	}
}

func TestReplaceMechanism(t *testing.T) {
	e := setup(t, fakes.Config{Name: "old"})
	ctx := context.Background()
	b := e.bind(t, "h", "r")
	oldBuf, err := b.Allocate(ctx, 4096)
	require.NoError(t, err)

	m2 := fakes.NewMechanism(fakes.Config{Name: "new", Authority: auth})
	require.NoError(t, e.mgr.Replace(dev0, m2))
	mech, err := e.mgr.Mechanism(dev0)
	require.NoError(t, err)
	require.Equal(t, m2.Info().Instance, mech.Info().Instance, "capability queries reflect the mechanism installed now")

	newBuf, err := b.Allocate(ctx, 4096)
	require.NoError(t, err)
	require.Equal(t, 1, m2.AllocateCallCount())
	require.NoError(t, oldBuf.Close())
	require.NoError(t, newBuf.Close())
	e.drain(t)
	require.Equal(t, 1, e.m.FreeCallCount(), "the old mechanism frees its own handle")
	require.Equal(t, 1, m2.FreeCallCount(), "the new mechanism frees its own handle")
	_, a, _ := e.m.FreeArgsForCall(0)
	require.Equal(t, e.m.Info().Instance, a.Creator())
	_, a, _ = m2.FreeArgsForCall(0)
	require.Equal(t, m2.Info().Instance, a.Creator())
	require.Zero(t, e.m.UsedBytes())
	require.Zero(t, m2.UsedBytes())
	require.Equal(t, figures{}, e.l.snapshot())

	m3 := fakes.NewMechanism(fakes.Config{Authority: "elsewhere"})
	require.ErrorIs(t, e.mgr.Replace(dev0, m3), memapi.ErrAuthorityMismatch)
}

func TestBindingClose(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "h", "r")
	buf, err := b.Allocate(context.Background(), 4096)
	require.NoError(t, err)
	err = b.Close()
	var me *memapi.Error
	require.ErrorAs(t, err, &me)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.Equal(t, memapi.Bytes(4096), e.m.UsedBytes(), "Close freed a live allocation")
	require.NoError(t, buf.Close())
	require.NoError(t, buf.Close(), "Close is idempotent")
	require.NoError(t, b.Close())
	_, err = b.Allocate(context.Background(), 4096)
	require.ErrorIs(t, err, memapi.ErrClosed)
	_, err = e.mgr.Bind("h", "r", memapi.DeviceKey{Kind: memapi.DeviceKindCUDA})
	require.ErrorIs(t, err, memapi.ErrInvalidRange)
}

func TestDroppedBufferIsReleased(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "h", "r")
	before := ep.Leaks()
	func() {
		_, err := b.Allocate(context.Background(), 4096)
		require.NoError(t, err)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for e.m.FreeCallCount() == 0 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	e.drain(t)
	require.Equal(t, 1, e.m.FreeCallCount())
	require.Greater(t, ep.Leaks(), before)
	require.Equal(t, figures{}, e.l.snapshot())
}

func tryCopyIn(e *env, addr memapi.DeviceAddr, p []byte) error {
	s, err := e.fctx.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.CopyToDevice(addr, p); err != nil {
		return err
	}
	return s.Synchronize(context.Background())
}

func copyIn(t *testing.T, e *env, addr memapi.DeviceAddr, p []byte) {
	t.Helper()
	require.NoError(t, tryCopyIn(e, addr, p))
}

func copyOut(t *testing.T, e *env, addr memapi.DeviceAddr, n int) []byte {
	t.Helper()
	s, err := e.fctx.NewStream()
	require.NoError(t, err)
	defer s.Close()
	p := make([]byte, n)
	require.NoError(t, s.CopyFromDevice(p, addr))
	require.NoError(t, s.Synchronize(context.Background()))
	return p
}
