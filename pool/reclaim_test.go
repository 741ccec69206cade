package pool_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

func allocAll(t *testing.T, p *pool.Pool, n int, size memapi.Bytes) []pool.Block {
	t.Helper()
	var bs []pool.Block
	for range n {
		b, err := p.Alloc(context.Background(), size, nil)
		require.NoError(t, err)
		bs = append(bs, b)
	}
	return bs
}

func freeAll(t *testing.T, bs []pool.Block) {
	t.Helper()
	for _, b := range bs {
		require.NoError(t, b.Free())
	}
}

// TestReclaimReleasesCache: a ticket gives back at least the bytes asked
// when the cache holds them, and the governor sees them refunded.
func TestReclaimReleasesCache(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{SegmentBytes: 4 << 20})
	ctx := context.Background()
	small := allocAll(t, e.p, 3000, 20000) // about 60 MiB of slabs
	large := allocAll(t, e.p, 6, 5<<20)
	freeAll(t, small)
	freeAll(t, large)
	before := e.checkLedger(t)
	require.Zero(t, before.InUse)
	require.Greater(t, before.Cached, memapi.Bytes(64<<20))
	want := memapi.Bytes(40 << 20)
	n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: want})
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, want)
	after := e.checkLedger(t)
	require.Equal(t, before.Segments-n, after.Segments)
	require.Equal(t, uint64(1), after.Reclaims)
	n2, err := e.p.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, after.Segments, n2)
	require.Zero(t, e.checkLedger(t).Segments)
}

// TestReclaimNeverTouchesInUse: with every block in use a ticket gives 0
// and the blocks keep their contents; with a mix only free segments go.
func TestReclaimNeverTouchesInUse(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{SegmentBytes: 2 << 20})
	ctx := context.Background()
	// Large blocks that fill their segments exactly: all in use.
	full := allocAll(t, e.p, 3, 3<<20)
	require.Zero(t, e.p.Stats().Cached)
	n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 1 << 30})
	require.NoError(t, err)
	require.Zero(t, n, "everything in use: nothing to give")
	freeAll(t, full)
	_, err = e.p.Trim(ctx)
	require.NoError(t, err)

	bs := allocAll(t, e.p, 40, 1<<20)
	bs = append(bs, allocAll(t, e.p, 3, 3<<20)...)
	for i, b := range bs {
		require.NoError(t, e.m.WriteMemory(b.Addr(), pattern(i, 512)))
	}
	before := e.p.Stats()
	n, err = e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 1 << 30})
	require.NoError(t, err)
	require.LessOrEqual(t, n, before.Cached, "only cached bytes go")
	require.Equal(t, before.InUse, e.p.Stats().InUse)
	freeAll(t, bs[:20])
	n, err = e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 1 << 30})
	require.NoError(t, err)
	require.NotZero(t, n)
	for i, b := range bs[20:] {
		got := make([]byte, 512)
		require.NoError(t, e.m.ReadMemory(b.Addr(), got), "a block in use lost its backing")
		require.Equal(t, pattern(i+20, 512), got)
	}
	s := e.checkLedger(t)
	require.Equal(t, memapi.Bytes(20<<20+9<<20), s.InUse)
	freeAll(t, bs[20:])
}

// TestCachesAskedFirst: under pressure the governor asks the pool (a cache)
// before a holder with a lower priority that would evict data.
func TestCachesAskedFirst(t *testing.T) {
	e := setup(t, 64<<20, pool.Options{SegmentBytes: 4 << 20})
	ctx := context.Background()
	var evicted memapi.Bytes
	require.NoError(t, e.g.Register("data", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) {
		evicted++
		return 0, nil
	}), governor.HolderOptions{Priority: -10}))
	require.NoError(t, e.g.Register("other", nil, governor.HolderOptions{Priority: 10}))
	data, err := e.g.Reserve(ctx, governor.Request{Authority: auth, Holder: "data", Role: "weights", Bytes: 16 << 20, Deadline: noDeadline})
	require.NoError(t, err)
	require.NoError(t, data.Draw(16<<20))
	lease, err := data.Commit()
	require.NoError(t, err)
	freeAll(t, allocAll(t, e.p, 10, 4<<20)) // 40 MiB cached
	g, err := e.g.Reserve(ctx, governor.Request{Authority: auth, Holder: "other", Role: "kv", Bytes: 24 << 20, Deadline: noDeadline})
	require.NoError(t, err, "the pool's cache covers the shortfall")
	require.Zero(t, evicted, "the data holder was asked before the cache")
	require.NotZero(t, e.holder("pool").Tickets)
	require.NoError(t, g.Cancel())
	require.NoError(t, lease.Refund(16<<20))
	e.checkLedger(t)
}

// TestOverBudgetTrimsOwnCacheFirst: a request that needs a new segment
// when the budget is full takes the pool's own cached segments first, then
// fails with the figures when even that is not enough.
func TestOverBudgetTrimsOwnCacheFirst(t *testing.T) {
	e := setup(t, 32<<20, pool.Options{SegmentBytes: 4 << 20, Wait: 20 * time.Millisecond})
	ctx := context.Background()
	bs := allocAll(t, e.p, 8, 3<<20) // eight 4 MiB segments: the whole budget
	freeAll(t, bs[:6])
	big, err := e.p.Alloc(ctx, 20<<20, nil)
	require.NoError(t, err, "the pool's own cache made room")
	s := e.checkLedger(t)
	// Five of the six cached segments went (the 20 MiB asked), one stays.
	require.Equal(t, memapi.Bytes(32<<20), s.Segments)
	require.Equal(t, memapi.Bytes(4<<20+2<<20), s.Cached, "one segment and two 1 MiB tails")
	require.Equal(t, uint64(1), s.Reclaims)

	before := s
	_, err = e.p.Alloc(ctx, 8<<20, nil)
	var ob *governor.OverBudgetError
	require.ErrorAs(t, err, &ob, "the governor's error inside the pool's")
	require.ErrorIs(t, err, memapi.ErrOverBudget)
	require.Equal(t, "pool", string(ob.Holder))
	var pe *pool.OverBudgetError
	require.ErrorAs(t, err, &pe, "the pool's figures beside the governor's")
	require.Equal(t, memapi.Bytes(8<<20), pe.Request)
	require.Equal(t, memapi.Bytes(8<<20), pe.Segment, "a huge request's own segment")
	// The last cached segment was trimmed first; in use is untouched.
	require.Equal(t, before.Segments-4<<20, pe.Held)
	require.Equal(t, before.InUse, pe.InUse)
	require.Equal(t, pe.Held-pe.InUse, pe.Cached)
	require.Equal(t, memapi.Bytes(4<<20), pe.Trimmed)
	// The message gives every figure of the pool's, and the governor's.
	require.Contains(t, err.Error(), fmt.Sprintf("[pool: request %d, segment %d, held %d (%d in use, %d cached), %d trimmed]",
		8<<20, 8<<20, pe.Held, pe.InUse, pe.Cached, 4<<20))
	require.Contains(t, err.Error(), "holder pool wanted")
	after := e.checkLedger(t)
	require.Equal(t, before.Segments-4<<20, after.Segments)
	require.Equal(t, memapi.Bytes(2<<20), after.Cached, "the tails of segments in use stay")
	require.Equal(t, before.InUse, after.InUse)
	require.Equal(t, uint64(1), after.OverBudget)
	require.NoError(t, big.Free())
	freeAll(t, bs[6:])
	_ = errors.Is
}

// TestOwnCacheAskedFirst: among caches, a pool that is short asks its own
// cache before another cache, even one of lower priority.
func TestOwnCacheAskedFirst(t *testing.T) {
	e := setup(t, 32<<20, pool.Options{SegmentBytes: 4 << 20, Wait: 20 * time.Millisecond})
	ctx := context.Background()
	asked := 0
	require.NoError(t, e.g.Register("other-cache", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) {
		asked++
		return 0, nil
	}), governor.HolderOptions{Cache: true, Priority: -10}))
	other, err := e.g.Reserve(ctx, governor.Request{Authority: auth, Holder: "other-cache", Role: "cache", Bytes: 8 << 20, Deadline: noDeadline})
	require.NoError(t, err)
	require.NoError(t, other.Draw(8<<20))
	lease, err := other.Commit()
	require.NoError(t, err)
	freeAll(t, allocAll(t, e.p, 6, 4<<20)) // 24 MiB cached: the budget is full
	big, err := e.p.Alloc(ctx, 12<<20, nil)
	require.NoError(t, err)
	require.Zero(t, asked, "the other cache was asked before the pool's own")
	require.NoError(t, big.Free())
	require.NoError(t, lease.Refund(8<<20))
	e.checkLedger(t)
}

// TestFailedReleaseStaysVisible: a segment release (the mechanism's Free,
// or the region's Decommit) that fails stays charged, quarantined, in the
// pool's Stats and the governor's snapshot; the next Trim retries it, and a
// Close that fails the same way is retried by the next Close.
func TestFailedReleaseStaysVisible(t *testing.T) {
	for _, tc := range []struct {
		backing pool.Backing
		method  string
	}{{pool.BackingSegments, "Free"}, {pool.BackingRegion, "Decommit"}} {
		t.Run(string(tc.backing), func(t *testing.T) {
			e := setup(t, 1<<30, pool.Options{Backing: tc.backing, SegmentBytes: 4 << 20})
			ctx := context.Background()
			freeAll(t, allocAll(t, e.p, 1, 3<<20))
			before := e.checkLedger(t)
			require.NotZero(t, before.Segments)
			e.m.Inject(fakes.Fault{Method: tc.method, Err: memapi.ErrUnavailable})
			n, err := e.p.Trim(ctx)
			require.NoError(t, err)
			require.Equal(t, before.Segments, n)
			s := e.checkLedger(t)
			require.Zero(t, s.Segments)
			require.Equal(t, before.Segments, s.Quarantined, "the failed release is quarantined, visible")
			require.Equal(t, before.Segments, e.holder("pool").Quarantined)

			// A Trim retries it; failing again, it stays.
			_, err = e.p.Trim(ctx)
			if err != nil {
				require.ErrorIs(t, err, ep.ErrQuarantined)
			}
			require.Equal(t, before.Segments, e.checkLedger(t).Quarantined)
			e.m.ClearFaults()
			_, err = e.p.Trim(ctx)
			require.NoError(t, err)
			s = e.checkLedger(t)
			require.Zero(t, s.Quarantined, "the retry released it")
			require.Zero(t, e.m.UsedBytes())

			// Close's own releases fail: still visible; Close again retries.
			bs := allocAll(t, e.p, 2, 3<<20)
			freeAll(t, bs)
			held := e.checkLedger(t).Segments
			e.m.Inject(fakes.Fault{Method: tc.method, Err: memapi.ErrUnavailable})
			require.NoError(t, e.p.Close())
			s = e.checkLedger(t)
			require.Zero(t, s.Segments)
			require.Equal(t, held, s.Quarantined)
			e.m.ClearFaults()
			require.NoError(t, e.p.Close())
			s = e.checkLedger(t)
			require.Zero(t, s.Quarantined)
			require.Zero(t, e.m.UsedBytes())
			require.Zero(t, e.holder("pool").Charged)
		})
	}
}
