package pool_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// checkSplit asserts that the governor's snapshot splits the pool's charge
// exactly as its Stats do: cached is Stats.Cached, in use Stats.InUse,
// on the holder and on the authority, with nothing clamped.
func (e *env) checkSplit(t *testing.T) pool.Stats {
	t.Helper()
	s := e.checkLedger(t)
	h := e.holder("pool")
	require.Equal(t, s.Cached, h.Cached, "snapshot cached == Stats.Cached")
	require.Equal(t, s.InUse, h.InUse(), "snapshot in use == Stats.InUse")
	require.Equal(t, h.CacheClamped, e.holder("pool").CacheClamped, "a quiescent pool never reports more than its charge")
	require.Zero(t, h.CacheErrors)
	a, ok := e.g.Authority(auth)
	require.True(t, ok)
	require.Equal(t, s.Cached, a.Cached, "the authority's cached bytes are the pool's")
	return s
}

// TestSnapshotSplitsPoolCharge: after allocations, frees (small, large,
// behind fences), reclaims and trims, the governor's snapshot shows the
// pool's in-use and cached bytes as the pool's Stats count them.
func TestSnapshotSplitsPoolCharge(t *testing.T) {
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) {
			e := setup(t, 1<<30, pool.Options{Backing: backing, SegmentBytes: 2 << 20})
			e.fctx.SetManualFences(true)
			ctx := context.Background()
			s1 := e.stream(t)

			require.Zero(t, e.checkSplit(t).Segments, "nothing held yet")
			small := allocAll(t, e.p, 500, 3000)
			large := allocAll(t, e.p, 6, 3<<20)
			s := e.checkSplit(t)
			require.NotZero(t, s.InUse)
			freeAll(t, small[:250])
			freeAll(t, large[:3])
			s = e.checkSplit(t)
			require.NotZero(t, s.Cached)
			require.NotZero(t, s.InUse)
			require.Equal(t, s.Cached, e.p.CachedBytes(auth))
			require.Zero(t, e.p.CachedBytes("another"), "nothing cached on another authority")

			// A block freed behind a fence not yet complete is cache too.
			b, err := e.p.Alloc(ctx, 5<<20, s1)
			require.NoError(t, err)
			f, err := s1.Record()
			require.NoError(t, err)
			require.NoError(t, b.RecordUse(f))
			require.NoError(t, b.Free())
			s = e.checkSplit(t)
			require.Equal(t, memapi.Bytes(5<<20), s.Pending)

			n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 4 << 20})
			require.NoError(t, err)
			if backing == pool.BackingSegments {
				require.NotZero(t, n, "wholly free segments go") // a region's tail is the pending block
			}
			e.checkSplit(t)
			e.fctx.CompleteAll()
			e.checkSplit(t)
			freeAll(t, small[250:])
			freeAll(t, large[3:])
			s = e.checkSplit(t)
			require.Zero(t, s.InUse)
			require.Equal(t, s.Segments, s.Cached, "everything held is cache")
			_, err = e.p.Trim(ctx)
			require.NoError(t, err)
			require.Zero(t, e.checkSplit(t).Segments)

		})
	}
}

// checkSnapshot is what every snapshot must show, however busy the pool:
// balanced ledgers, and no cache beyond the charge that is not
// quarantined, on the holder and on the authority.
func checkSnapshot(s governor.Snapshot) error {
	for _, a := range s.Authorities {
		if !a.Balanced() || a.Cached+a.Quarantined > a.Charged {
			return fmt.Errorf("authority %+v", a)
		}
	}
	for _, h := range s.Holders {
		for _, ha := range h.Authorities {
			if ha.Cached+ha.Quarantined > ha.Charged || ha.CacheErrors != 0 {
				return fmt.Errorf("holder %s %+v", h.ID, ha)
			}
		}
	}
	return nil
}

// TestSnapshotUnderGrowthAndPressure: snapshots taken while the pool grows
// (its growth asking its own cache, then other caches), while another
// holder's pressure makes the governor call the pool's Reclaim, from inside
// a Reclaim that runs in the pool's own growth, and while blocks come and
// go, never deadlock, always balance, never show more cached than
// charged; once quiet, the split is exact. Run it under -race.
func TestSnapshotUnderGrowthAndPressure(t *testing.T) {
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) {
			e := setup(t, 32<<20, pool.Options{Backing: backing, SegmentBytes: 2 << 20})
			ctx := context.Background()
			errs := make(chan error, 64)
			report := func(err error) {
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
			// A cache that gives nothing and takes a snapshot whenever it is
			// asked: in the pool's own growth (the growth's goroutine, its
			// region transaction held) and in the other holder's pressure.
			var spyAsked atomic.Int64
			require.NoError(t, e.g.Register("spy", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) {
				spyAsked.Add(1)
				report(checkSnapshot(e.g.Snapshot()))
				return 0, nil
			}), governor.HolderOptions{Cache: true}))
			spy := charge(t, e.g, "spy", 1<<20)
			require.NoError(t, e.g.Register("other", nil, governor.HolderOptions{Priority: 10}))

			const rounds = 300
			// 16 MiB in use, worker 0's, while the other holder asks for 24
			// of 32; allocated before the workers start, so that worker 1's
			// blocks (up to six of up to 3 MiB) take only what is left.
			held := allocAll(t, e.p, 8, 2<<20)
			asked := make(chan struct{})
			var wg sync.WaitGroup
			for w := range 2 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 7))
					var live []pool.Block
					free := func(i int) {
						report(live[i].Free())
						live = append(live[:i], live[i+1:]...)
					}
					if w == 0 {
						live = held
						<-asked
					}
					for i := range rounds {
						if i%8 == 0 {
							report(checkSnapshot(e.g.Snapshot()))
						}
						if len(live) > 0 && (r.IntN(2) == 0 || len(live) > 5) {
							free(r.IntN(len(live)))
							continue
						}
						b, err := e.p.Alloc(ctx, memapi.Bytes(256+r.IntN(3<<20)), nil)
						if errors.Is(err, memapi.ErrOverBudget) {
							continue // the other holder holds the budget for now
						}
						report(err)
						if err == nil {
							live = append(live, b)
						}
					}
					for len(live) > 0 {
						free(0)
					}
				})
			}
			// Another holder that needs most of the budget: the governor asks
			// the caches (the pool's first) from this goroutine. Its waits are
			// bounded so that it never holds up the pool's allocations.
			wg.Go(func() {
				for i := range rounds / 10 {
					wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
					gr, err := e.g.Reserve(wctx, governor.Request{Authority: auth, Holder: "other", Role: "kv", Bytes: 24 << 20, Deadline: noDeadline})
					cancel()
					if i == 0 {
						close(asked)
					}
					if errors.Is(err, memapi.ErrOverBudget) {
						continue
					}
					report(err)
					if err == nil {
						report(gr.Cancel())
					}
				}
			})
			stop := make(chan struct{})
			var watch sync.WaitGroup
			watch.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					report(checkSnapshot(e.g.Snapshot()))
				}
			})
			watchdog.Within(t, watchdog.Bound, "the workers", wg.Wait)
			close(stop)
			watch.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.NotZero(t, e.holder("pool").Tickets, "pressure asked the pool")
			require.NotZero(t, spyAsked.Load(), "a snapshot was taken inside a Reclaim")
			require.NoError(t, spy.Refund(1<<20))
			t.Logf("snapshots that clamped the pool's cache to its charge (races with growth and refunds): %d", e.holder("pool").CacheClamped)
			e.checkSplit(t)
			require.Zero(t, e.p.Stats().InUse)
		})
	}
}

// charge commits a lease of n bytes for holder on the pool's authority.
func charge(t *testing.T, g *governor.Governor, holder governor.HolderID, n memapi.Bytes) governor.Lease {
	t.Helper()
	gr, err := g.Reserve(context.Background(), governor.Request{Authority: auth, Holder: holder, Role: "", Bytes: n, Deadline: noDeadline})
	require.NoError(t, err)
	require.NoError(t, gr.Draw(n))
	l, err := gr.Commit()
	require.NoError(t, err)
	return l
}
