package pool_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// holesEnv is a region pool over the fakes (64 KiB granules) that
// decommits every whole free granule before its committed bytes rise.
func holesEnv(t *testing.T, capacity memapi.Bytes) *env {
	return setupWith(t, capacity, pool.Options{Backing: pool.BackingRegion, SegmentBytes: 1 << 20, HoleSlack: 1e-9,
		Wait: 10 * time.Millisecond}, fakes.Config{Granularity: 64 << 10})
}

// write fills the block with its pattern; intact checks it.
func write(t *testing.T, e *env, b pool.Block, seed int) {
	t.Helper()
	require.NoError(t, e.m.WriteMemory(b.Addr(), pattern(seed, int(b.Size()))))
}

func intact(t *testing.T, e *env, b pool.Block, seed int) {
	t.Helper()
	got := make([]byte, b.Size())
	require.NoError(t, e.m.ReadMemory(b.Addr(), got), "block %d unreadable", seed)
	require.True(t, bytes.Equal(pattern(seed, len(got)), got), "block %d overwritten", seed)
}

// holed allocates eight 512 KiB blocks with patterns and frees 1, 2 and 5:
// 1.5 MiB of whole free granules between live blocks.
func holed(t *testing.T, e *env) (live map[int]pool.Block) {
	t.Helper()
	bs := allocAll(t, e.p, 8, 512<<10)
	live = map[int]pool.Block{}
	for i, b := range bs {
		write(t, e, b, i)
		live[i] = b
	}
	for _, i := range []int{1, 2, 5} {
		require.NoError(t, live[i].Free())
		delete(live, i)
	}
	return live
}

// TestHolesDecommittedBeforeGrowth: before the region grows, the whole free
// granules between live blocks are decommitted (the governor's charge, the
// mechanism's bytes and Segments fall together); a block placed in a hole
// is committed again first; live blocks never lose a byte.
func TestHolesDecommittedBeforeGrowth(t *testing.T) {
	e := holesEnv(t, 1<<30)
	ctx := context.Background()
	live := holed(t, e)
	before := e.checkLedger(t)
	require.Zero(t, before.Decommitted)
	big, err := e.p.Alloc(ctx, 3<<20, nil) // no free chunk fits: the region grows
	require.NoError(t, err)
	s := e.checkLedger(t)
	require.Equal(t, memapi.Bytes(3<<19), s.Decommitted)
	require.Equal(t, before.Segments-3<<19+3<<20, s.Segments, "held: the old bytes less the holes, plus the growth")
	require.Equal(t, s.Segments, e.m.UsedBytes())
	require.Equal(t, s.Segments, s.PeakSegments, "the peak never held the holes and the growth at once")
	for i, b := range live {
		intact(t, e, b, i)
	}
	// A block in a hole: committed again, usable.
	h, err := e.p.Alloc(ctx, 512<<10, nil)
	require.NoError(t, err)
	write(t, e, h, 100)
	s = e.checkLedger(t)
	require.Equal(t, memapi.Bytes(1<<20), s.Decommitted)
	require.Equal(t, uint64(1), s.Recommits)
	intact(t, e, h, 100)
	for i, b := range live {
		intact(t, e, b, i)
		require.NoError(t, b.Free())
	}
	require.NoError(t, h.Free())
	require.NoError(t, big.Free())
	n, err := e.p.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, s.Segments, n)
	s = e.checkLedger(t)
	require.Zero(t, s.Segments)
	require.Zero(t, s.Decommitted)
	require.Zero(t, e.m.UsedBytes())
}

// TestRecommitFailureChangesNothing: a block that needs a hole committed
// again fails with the mechanism's error when the commit fails; nothing in
// use, held or decommitted changes, and the same request succeeds later at
// the same address.
func TestRecommitFailureChangesNothing(t *testing.T) {
	e := holesEnv(t, 1<<30)
	ctx := context.Background()
	live := holed(t, e)
	n, err := e.p.Trim(ctx) // the holes go
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(3<<19), n)
	before := e.checkLedger(t)
	e.m.Inject(fakes.Fault{Method: "Commit", Err: memapi.ErrOutOfMemory})
	_, err = e.p.Alloc(ctx, 512<<10, nil)
	require.ErrorIs(t, err, memapi.ErrOutOfMemory)
	e.m.ClearFaults()
	after := e.checkLedger(t)
	require.Equal(t, before.InUse, after.InUse)
	require.Equal(t, before.Segments, after.Segments)
	require.Equal(t, before.Decommitted, after.Decommitted)
	require.Equal(t, before.Allocs, after.Allocs)
	h, err := e.p.Alloc(ctx, 512<<10, nil)
	require.NoError(t, err)
	write(t, e, h, 9)
	e.checkLedger(t)
	for i, b := range live {
		intact(t, e, b, i)
		require.NoError(t, b.Free())
	}
	require.NoError(t, h.Free())
}

// TestRecommitOverBudget: when another holder took the bytes a hole gave
// back, committing it again fails over budget with the pool's figures;
// nothing changes.
//
// Options.Wait is the watchdog's bound here: the recommit that must succeed
// may wait on a loaded machine; the one that must fail is bounded by its
// own context instead.
func TestRecommitOverBudget(t *testing.T) {
	e := setupWith(t, 4<<20, pool.Options{Backing: pool.BackingRegion, SegmentBytes: 1 << 20, HoleSlack: 1e-9,
		Wait: watchdog.Bound}, fakes.Config{Granularity: 64 << 10})
	ctx := context.Background()
	live := holed(t, e)
	_, err := e.p.Trim(ctx)
	require.NoError(t, err)
	before := e.checkLedger(t)
	require.NoError(t, e.g.Register("other", nil, governor.HolderOptions{}))
	ob, err := e.mgr.Bind("other", "data", dev0)
	require.NoError(t, err)
	s, _ := e.g.Authority(auth)
	buf, err := ob.Allocate(ctx, s.Free)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	watchdog.Within(t, watchdog.Bound, "Alloc over budget", func() { _, err = e.p.Alloc(short, 512<<10, nil) })
	require.ErrorIs(t, err, memapi.ErrOverBudget)
	var ob2 *pool.OverBudgetError
	require.True(t, errors.As(err, &ob2), "the pool's figures")
	e.drain(t)
	after := e.p.Stats()
	require.Equal(t, after.Segments, e.holder("pool").Charged)
	require.Equal(t, after.Segments+buf.Size(), e.m.UsedBytes())
	require.Equal(t, after.Segments, after.Cached+after.InUse)
	require.Equal(t, before.InUse, after.InUse)
	require.Equal(t, before.Segments, after.Segments)
	require.Equal(t, before.Decommitted, after.Decommitted)
	require.NoError(t, buf.Close())
	e.drain(t)
	var h pool.Block
	watchdog.Within(t, watchdog.Bound, "Alloc", func() { h, err = e.p.Alloc(ctx, 512<<10, nil) })
	require.NoError(t, err)
	require.NoError(t, h.Free())
	e.checkLedger(t)
	for _, b := range live {
		require.NoError(t, b.Free())
	}
	require.NoError(t, ob.Close())
}

// TestHolesSkipPendingBlocks: a block freed behind a fence that has not
// completed keeps its granules committed through a Trim; once the fence
// completed they go too.
func TestHolesSkipPendingBlocks(t *testing.T) {
	e := holesEnv(t, 1<<30)
	e.fctx.SetManualFences(true)
	ctx := context.Background()
	st, err := e.fctx.NewStream()
	require.NoError(t, err)
	defer st.Close()
	bs := allocAll(t, e.p, 4, 512<<10)
	f, err := st.Record()
	require.NoError(t, err)
	require.NoError(t, bs[1].RecordUse(f))
	require.NoError(t, bs[1].Free()) // pending behind f
	n, err := e.p.Trim(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the only free block waits for its fence")
	s := e.checkLedger(t)
	require.Zero(t, s.Decommitted)
	require.Equal(t, s.Segments, e.m.UsedBytes())
	e.fctx.CompleteAll()
	n, err = e.p.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(512<<10), n)
	require.Equal(t, memapi.Bytes(512<<10), e.checkLedger(t).Decommitted)
	for _, i := range []int{0, 2, 3} {
		require.NoError(t, bs[i].Free())
	}
}

// TestFailedHoleDecommitStaysVisible: a hole whose decommit fails on the
// queue stays charged, quarantined and in Stats; the next Trim retries it.
func TestFailedHoleDecommitStaysVisible(t *testing.T) {
	e := holesEnv(t, 1<<30)
	ctx := context.Background()
	live := holed(t, e)
	e.m.Inject(fakes.Fault{Method: "Decommit", Err: memapi.ErrUnavailable})
	_, err := e.p.Trim(ctx)
	noErrorButQuarantine(t, err)
	s := e.checkLedger(t)
	require.NotZero(t, s.Quarantined)
	require.Equal(t, s.Quarantined, e.holder("pool").Quarantined)
	e.m.ClearFaults()
	_, err = e.p.Trim(ctx)
	require.NoError(t, err)
	s = e.checkLedger(t)
	require.Zero(t, s.Quarantined)
	require.Equal(t, memapi.Bytes(3<<19), s.Decommitted)
	// A block in the once-quarantined hole.
	h, err := e.p.Alloc(ctx, 1<<20, nil)
	require.NoError(t, err)
	write(t, e, h, 7)
	for i, b := range live {
		intact(t, e, b, i)
		require.NoError(t, b.Free())
	}
	require.NoError(t, h.Free())
	e.checkLedger(t)
}
