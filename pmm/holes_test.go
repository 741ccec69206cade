package pmm_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

func span(off, n int) memapi.Range {
	return memapi.Range{Off: memapi.Bytes(off) * gran, Len: memapi.Bytes(n) * gran}
}

// Decommit makes a hole inside the region behind its fences (pending until
// they complete, then refunded after the mechanism's decommit); Commit
// backs it again with a fresh charge; Len and the address never move.
func TestDecommitAndCommitHoles(t *testing.T) {
	e := setup(t, fakes.Config{})
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	b, r := e.region(t, 16*gran)
	addr := r.Addr()
	require.NoError(t, r.Grow(ctx, 3*gran, nil))
	require.NoError(t, r.Grow(ctx, 6*gran, nil))
	f := e.fence(t)
	require.NoError(t, r.RecordUse(f))
	// Across the two grows' segments.
	require.NoError(t, r.Decommit(ctx, span(2, 2)))
	require.Equal(t, figures{Charged: 4 * gran, Pending: 2 * gran}, e.l.snapshot())
	e.notDrained(t)
	require.Equal(t, memapi.Bytes(6*gran), e.m.UsedBytes(), "decommitted before the fence completed")
	f.Complete()
	e.drain(t)
	require.Equal(t, figures{Charged: 4 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(4*gran), e.m.UsedBytes())
	require.Equal(t, memapi.Bytes(4*gran), r.Committed())
	require.Equal(t, memapi.Bytes(6*gran), r.Len(), "the length stays")

	before := e.state(b)
	for _, c := range []struct {
		rng  memapi.Range
		kind error
	}{
		{span(1, 2), memapi.ErrNotCommitted}, // half in the hole
		{span(6, 1), memapi.ErrInvalidRange}, // above Len
		{memapi.Range{Off: gran / 2, Len: gran}, memapi.ErrInvalidRange},
		{memapi.Range{Off: gran, Len: 0}, memapi.ErrInvalidRange},
	} {
		require.ErrorIs(t, r.Decommit(ctx, c.rng), c.kind, "decommit %+v", c.rng)
		require.Equal(t, before, e.state(b))
	}
	require.ErrorIs(t, r.Commit(ctx, span(1, 2)), memapi.ErrCommitted)
	require.ErrorIs(t, r.Commit(ctx, span(5, 2)), memapi.ErrCommitted, "half on backing, half above Len")
	require.ErrorIs(t, r.Commit(ctx, span(15, 2)), memapi.ErrInvalidRange, "beyond the reservation")
	require.Equal(t, before, e.state(b))

	// A second hole, then the first is backed again piecewise.
	require.NoError(t, r.Decommit(ctx, span(5, 1)))
	e.drain(t)
	require.Equal(t, figures{Charged: 3 * gran}, e.l.snapshot())
	require.NoError(t, r.Commit(ctx, span(3, 1)))
	require.NoError(t, r.Commit(ctx, span(2, 1)))
	require.Equal(t, figures{Charged: 5 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(5*gran), e.m.UsedBytes())
	require.Equal(t, addr, r.Addr())

	// A shrink across the hole removes only what is backed.
	require.NoError(t, r.Shrink(ctx, 4*gran, nil))
	e.drain(t)
	require.Equal(t, figures{Charged: 4 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(4*gran), e.m.UsedBytes())
	require.NoError(t, r.Decommit(ctx, span(0, 4)))
	require.NoError(t, r.Commit(ctx, span(1, 1)))
	require.NoError(t, r.Close())
	e.settled(t)
}

// Commit backs any granule-aligned range of the reservation, above Len
// too (sparse: Len rises to its end, the gap below it is a hole that Commit
// can back later), each range charged exactly its bytes; Decommit and
// Shrink take sparse pieces back the same way. Before, a range above Len
// was memapi.ErrInvalidRange.
func TestSparseCommit(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b, r := e.region(t, 16*gran)
	addr := r.Addr()
	require.NoError(t, r.Commit(ctx, span(8, 2)), "a range above Len 0")
	require.Equal(t, memapi.Bytes(10*gran), r.Len(), "Len rises to the range's end")
	require.Equal(t, figures{Charged: 2 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(2*gran), e.m.UsedBytes())
	require.Equal(t, memapi.Bytes(2*gran), r.Committed())
	require.NoError(t, r.Commit(ctx, span(13, 1)), "above Len again, past a gap")
	require.NoError(t, r.Commit(ctx, span(2, 3)), "inside the gap below")
	require.Equal(t, memapi.Bytes(14*gran), r.Len())
	require.Equal(t, figures{Charged: 6 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(6*gran), e.m.UsedBytes())
	before := e.state(b)
	require.ErrorIs(t, r.Commit(ctx, span(9, 2)), memapi.ErrCommitted, "overlapping a sparse piece")
	require.ErrorIs(t, r.Commit(ctx, span(15, 2)), memapi.ErrInvalidRange, "beyond the reservation")
	require.ErrorIs(t, r.Decommit(ctx, span(10, 2)), memapi.ErrNotCommitted, "a hole")
	require.Equal(t, before, e.state(b))
	// Grow from Len, then take pieces back.
	require.NoError(t, r.Grow(ctx, 16*gran, nil))
	require.Equal(t, figures{Charged: 8 * gran}, e.l.snapshot())
	require.NoError(t, r.Decommit(ctx, span(8, 2)))
	require.NoError(t, r.Shrink(ctx, 4*gran, nil))
	e.drain(t)
	require.Equal(t, figures{Charged: 2 * gran}, e.l.snapshot(), "[2,4) is what is left")
	require.Equal(t, memapi.Bytes(2*gran), e.m.UsedBytes())
	require.Equal(t, memapi.Bytes(4*gran), r.Len())
	require.Equal(t, addr, r.Addr())
	require.NoError(t, r.Close())
	e.settled(t)
}

// hole is the hole tests' common start: a fresh env, a region of 8
// granules grown to grow granules, then rng decommitted.
type hole struct {
	grow  int
	rng   memapi.Range
	fault *fakes.Fault // injected into the mechanism just before the Decommit
	// fence: the env's fences are manual, and one recorded on the region
	// before the Decommit is returned not completed, so its release still
	// waits; without it the release has run when make returns.
	fence bool
}

func (h hole) make(t *testing.T) (*env, *pmm.Binding, *pmm.Region, *fakes.Fence) {
	t.Helper()
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b, r := e.region(t, 8*gran)
	require.NoError(t, r.Grow(ctx, memapi.Bytes(h.grow)*gran, nil))
	var f *fakes.Fence
	if h.fence {
		e.fctx.SetManualFences(true)
		f = e.fence(t)
		require.NoError(t, r.RecordUse(f))
	}
	if h.fault != nil {
		e.m.Inject(*h.fault)
	}
	require.NoError(t, r.Decommit(ctx, h.rng))
	if !h.fence {
		e.drain(t)
	}
	return e, b, r, f
}

// A transaction after a Decommit waits for its release: the range is
// committed again only once it is really gone.
func TestCommitWaitsForAnEarlierDecommit(t *testing.T) {
	e, _, r, f := hole{grow: 3, rng: span(1, 1), fence: true}.make(t)
	ctx := context.Background()
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	err := r.Commit(short, span(1, 1))
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, figures{Charged: 2 * gran, Pending: gran}, e.l.snapshot())
	f.Complete()
	require.NoError(t, r.Commit(ctx, span(1, 1)))
	require.Equal(t, figures{Charged: 3 * gran}, e.l.snapshot())
	require.NoError(t, r.Close())
	e.settled(t)
}

// Every step of Commit fails in turn: the ledger, the mechanism and the
// region are as before, and the hole can be committed afterwards.
func TestCommitFaultsLeaveNoTrace(t *testing.T) {
	steps := []struct {
		name   string
		inject func(e *env)
		want   error
	}{
		{"reserve", func(e *env) { e.l.failReserve = e.l.reserves + 1 }, errInjected},
		{"commit-range", func(e *env) { e.m.Inject(fakes.Fault{Method: "Commit", Err: memapi.ErrOutOfMemory}) }, memapi.ErrOutOfMemory},
		{"commit-charge", func(e *env) { e.l.failCommit = e.l.commits + 1 }, errInjected},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			e, b, r, _ := hole{grow: 4, rng: span(1, 2)}.make(t)
			ctx := context.Background()
			before, committed := e.state(b), r.Committed()
			st.inject(e)
			require.ErrorIs(t, r.Commit(ctx, span(1, 2)), st.want)
			e.m.ClearFaults()
			require.Equal(t, before, e.state(b))
			require.Equal(t, committed, r.Committed())
			require.Zero(t, r.Quarantined())
			require.NoError(t, r.Commit(ctx, span(1, 2)))
			require.Equal(t, figures{Charged: 4 * gran}, e.l.snapshot())
			require.NoError(t, r.Close())
			e.settled(t)
		})
	}
}

// A Commit whose charge cannot commit and whose rollback cannot decommit
// keeps the range quarantined (charged, visible); Retry removes it.
func TestCommitRollbackThatFailsIsQuarantined(t *testing.T) {
	e, _, r, _ := hole{grow: 3, rng: span(1, 1)}.make(t)
	ctx := context.Background()
	e.l.failCommit = e.l.commits + 1
	e.m.Inject(fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable})
	require.ErrorIs(t, r.Commit(ctx, span(1, 1)), ep.ErrQuarantined)
	require.Equal(t, memapi.Bytes(gran), r.Quarantined())
	require.Equal(t, memapi.Bytes(3*gran), e.m.UsedBytes())
	require.Equal(t, memapi.Bytes(2*gran), r.Committed())
	e.m.ClearFaults()
	require.NoError(t, r.Retry(ctx))
	require.Zero(t, r.Quarantined())
	require.Equal(t, memapi.Bytes(2*gran), e.m.UsedBytes())
	require.Equal(t, figures{Charged: 2 * gran}, e.l.snapshot())
	require.NoError(t, r.Close())
	e.settled(t)
}

// A Decommit whose release fails stays charged and quarantined; a Commit
// of the range fails while it cannot be removed, and removes it first once
// it can.
func TestFailedDecommitIsQuarantinedAndRetried(t *testing.T) {
	stuck := fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable}
	e, _, r, _ := hole{grow: 4, rng: span(1, 2), fault: &stuck}.make(t)
	ctx := context.Background()
	require.Equal(t, figures{Charged: 4 * gran, Quarantined: 2 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(2*gran), r.Quarantined())
	require.Equal(t, memapi.Bytes(4*gran), e.m.UsedBytes())
	require.ErrorIs(t, r.Commit(ctx, span(1, 1)), ep.ErrQuarantined)
	require.Equal(t, memapi.Bytes(4*gran), e.m.UsedBytes())
	e.m.ClearFaults()
	require.NoError(t, r.Commit(ctx, span(1, 1)))
	require.Zero(t, r.Quarantined())
	require.Equal(t, figures{Charged: 3 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(3*gran), e.m.UsedBytes())
	// Closed with a quarantined hole: Close removes it with the rest.
	e.m.Inject(stuck)
	require.NoError(t, r.Decommit(ctx, span(3, 1)))
	e.drain(t)
	e.m.ClearFaults()
	require.NoError(t, r.Close())
	e.settled(t)
}

// A hole whose release keeps failing blocks only the transactions that
// need its range: other holes are committed again, the region grows past
// it, and its bytes stay quarantined (charged, visible) throughout until a
// Commit of its own range removes it once the fault clears.
func TestStuckHoleBlocksOnlyItsOwnRange(t *testing.T) {
	stuck := fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable,
		When: func(c fakes.Call) bool { return c.Args[2].(memapi.Range) == span(1, 2) }}
	e, _, r, _ := hole{grow: 6, rng: span(1, 2), fault: &stuck}.make(t)
	ctx := context.Background()
	require.Equal(t, figures{Charged: 6 * gran, Quarantined: 2 * gran}, e.l.snapshot())
	// Another hole, committed again while the first is stuck.
	require.NoError(t, r.Decommit(ctx, span(4, 1)))
	e.drain(t)
	require.Equal(t, figures{Charged: 5 * gran, Quarantined: 2 * gran}, e.l.snapshot())
	require.NoError(t, r.Commit(ctx, span(4, 1)))
	require.NoError(t, r.Grow(ctx, 8*gran, nil))
	require.Equal(t, figures{Charged: 8 * gran, Quarantined: 2 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(8*gran), e.m.UsedBytes(), "the stuck hole is still committed")
	require.Equal(t, memapi.Bytes(6*gran), r.Committed())
	require.Equal(t, memapi.Bytes(2*gran), r.Quarantined())
	// Its own range, whole or in part, fails and changes nothing.
	for _, rng := range []memapi.Range{span(1, 2), span(2, 1)} {
		require.ErrorIs(t, r.Commit(ctx, rng), ep.ErrQuarantined, "commit %v", rng)
		require.Equal(t, figures{Charged: 8 * gran, Quarantined: 2 * gran}, e.l.snapshot())
		require.Equal(t, memapi.Bytes(2*gran), r.Quarantined())
	}
	// A range partly backed is refused before anything is tried.
	calls := e.m.DecommitCallCount()
	require.ErrorIs(t, r.Commit(ctx, span(0, 2)), memapi.ErrCommitted)
	require.Equal(t, calls, e.m.DecommitCallCount(), "nothing was removed for a bad range")
	e.m.ClearFaults()
	require.NoError(t, r.Commit(ctx, span(2, 1)))
	require.Zero(t, r.Quarantined())
	require.Equal(t, figures{Charged: 7 * gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(7*gran), e.m.UsedBytes())
	require.NoError(t, r.Commit(ctx, span(1, 1)))
	require.NoError(t, r.Close())
	e.settled(t)
}

// MapShared removes the quarantined backing in the range it maps (a Grow
// rollback's, above the end) first, and fails while it cannot; a stuck hole
// below the end does not stop it and stays quarantined.
func TestMapSharedRemovesOnlyTheQuarantineInItsRange(t *testing.T) {
	stuckHole := fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable,
		When: func(c fakes.Call) bool { return c.Args[2].(memapi.Range) == span(1, 1) }}
	e, _, r, _ := hole{grow: 3, rng: span(1, 1), fault: &stuckHole}.make(t)
	ctx := context.Background()
	e.l.failCommit = e.l.commits + 1
	e.m.Inject(fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable})
	require.ErrorIs(t, r.Grow(ctx, 5*gran, nil), ep.ErrQuarantined)
	sh, err := e.bind(t, "p", "prompt").CreateShared(ctx, gran)
	require.NoError(t, err)
	stuck := figures{Charged: 6 * gran, Quarantined: 3 * gran}
	require.Equal(t, stuck, e.l.snapshot())
	_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
	require.ErrorIs(t, err, ep.ErrQuarantined)
	require.Equal(t, stuck, e.l.snapshot())
	require.Equal(t, memapi.Bytes(3*gran), r.Len())
	e.m.ClearFaults()
	e.m.Inject(stuckHole)
	rng, err := r.MapShared(ctx, sh, memapi.AccessReadOnly)
	require.NoError(t, err)
	require.Equal(t, span(3, 1), rng)
	require.Equal(t, memapi.Bytes(gran), r.Quarantined(), "the stuck hole stays")
	require.Equal(t, figures{Charged: 4 * gran, Quarantined: gran}, e.l.snapshot())
	require.Equal(t, memapi.Bytes(4*gran), e.m.UsedBytes())
	e.m.ClearFaults()
	require.NoError(t, r.Retry(ctx))
	require.Equal(t, figures{Charged: 3 * gran}, e.l.snapshot())
	require.NoError(t, r.Close())
	require.NoError(t, sh.Close())
	e.settled(t)
}

// Close during a Decommit's release: the final release runs after it and
// frees the rest; nothing is left.
func TestCloseAfterDecommitBehindAFence(t *testing.T) {
	e, _, r, f := hole{grow: 5, rng: span(1, 2), fence: true}.make(t)
	require.NoError(t, r.Close())
	require.Equal(t, figures{Pending: 5 * gran}, e.l.snapshot())
	e.notDrained(t)
	f.Complete()
	e.settled(t)
}

// On the CPU mechanism the kernel agrees after every step (mincore), and a
// hole's neighbours keep their contents.
func TestHolesOnTheCPU(t *testing.T) {
	m, err := cpu.New(cpu.Options{Granularity: 4096, Authority: auth})
	require.NoError(t, err)
	cctx := cpu.NewContext(m)
	ectx := ep.NewContext(cctx, ep.Options{})
	g, l := newFaulty(auth)
	defer g.Close()
	mgr := pmm.New(g, pmm.Options{Verify: true})
	require.NoError(t, mgr.Register(pmm.Device{Key: dev0, Mechanism: m, Context: ectx, Authority: auth}))
	ctx := context.Background()
	defer watchdog.Within(t, watchdog.Bound, "the device context's Close", func() { require.NoError(t, ectx.Close(ctx, true)) })
	b, err := mgr.Bind("kv", "cache", dev0)
	require.NoError(t, err)
	r, err := b.ReserveVirtual(ctx, 64*4096)
	require.NoError(t, err)
	check := func(want memapi.Bytes) {
		t.Helper()
		require.NoError(t, ectx.Queue().Drain(ctx))
		k, err := m.KernelBytes()
		require.NoError(t, err)
		require.Equal(t, figures{Charged: want}, l.snapshot())
		require.Equal(t, want, m.UsedBytes())
		require.Equal(t, want, k, "mincore")
	}
	require.NoError(t, r.Grow(ctx, 16*4096, nil))
	st, err := cctx.NewStream()
	require.NoError(t, err)
	defer st.Close()
	for i := range 16 {
		require.NoError(t, st.CopyToDevice(r.Addr()+memapi.DeviceAddr(i*4096), []byte{byte(i + 1)}))
	}
	require.NoError(t, st.Synchronize(ctx))
	check(16 * 4096)
	require.NoError(t, r.Decommit(ctx, memapi.Range{Off: 4 * 4096, Len: 8 * 4096}))
	check(8 * 4096)
	require.NoError(t, r.Commit(ctx, memapi.Range{Off: 6 * 4096, Len: 2 * 4096}))
	check(10 * 4096)
	for i, want := range map[int]byte{3: 4, 6: 0, 12: 13} {
		got := make([]byte, 1)
		require.NoError(t, st.CopyFromDevice(got, r.Addr()+memapi.DeviceAddr(i*4096)))
		require.NoError(t, st.Synchronize(ctx))
		require.Equal(t, want, got[0], "granule %d", i)
	}
	require.NoError(t, r.Close())
	check(0)
	require.NoError(t, b.Close())
}
