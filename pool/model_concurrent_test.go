package pool_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// concurrentModelSteps is the steps of one check of TestPoolModelConcurrent:
// with rapid's default 100 checks per backing, 20,000 steps in all.
const concurrentModelSteps = 100

// TestPoolModelConcurrent runs random steps against the pool, some of them
// on other goroutines, with faults injected at growth (Allocate, Commit)
// and at release (Free, Decommit), and checks the ledger identity after
// every step (checkLedger: the governor charges the pool its segments and
// its quarantined bytes, and the mechanism holds exactly those). The
// steps: Alloc; Free from another goroutine; two Frees of one block racing
// (one wins, the other is ErrDoubleFree); RecordUse of a block in use
// racing a Free of a stale handle of the same block (ErrDoubleFree,
// nothing of the owner's touched); Reclaim; Trim. Each check ends with a
// Close that comes while a growth's Allocate runs, when the growth got
// that far; a release that failed stays visible until a later Close
// retries it, and then nothing is left anywhere. Every wait is bounded
// (watchdog).
func TestPoolModelConcurrent(t *testing.T) {
	var steps atomic.Int64
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) { poolModelConcurrent(t, backing, &steps) })
	}
	t.Logf("%d steps", steps.Load())
}

func poolModelConcurrent(t *testing.T, backing pool.Backing, steps *atomic.Int64) {
	rapid.Check(t, func(rt *rapid.T) {
		// The growth that Close interrupts: blocked in the mechanism's
		// Allocate once armed.
		var armed atomic.Bool
		entered, resume := make(chan struct{}), make(chan struct{})
		e := setupWith(rt, 64<<20, pool.Options{SegmentBytes: 2 << 20, SlabBytes: 256 << 10, HugeBytes: 4 << 20, Backing: backing,
			Wait: 20 * time.Millisecond}, fakes.Config{Granularity: 64 << 10})
		e.m.Inject(fakes.Fault{Method: "Allocate", When: func(fakes.Call) bool {
			if armed.CompareAndSwap(true, false) {
				close(entered)
				<-resume
			}
			return false
		}, Err: memapi.ErrOutOfMemory})
		growRate := rapid.SampledFrom([]int{0, 10}).Draw(rt, "growFaults")
		releaseRate := rapid.SampledFrom([]int{0, 10, 50}).Draw(rt, "releaseFaults")
		for _, m := range []string{"Allocate", "Commit"} {
			e.m.Inject(rateFault(m, growRate, memapi.ErrOutOfMemory))
		}
		for _, m := range []string{"Free", "Decommit"} {
			e.m.Inject(rateFault(m, releaseRate, memapi.ErrUnavailable))
		}
		ctx := context.Background()
		var blocks, stale []pool.Block
		var fences []*flagFence
		sizes := rapid.OneOf(rapid.Uint64Range(1, 4096), rapid.Uint64Range(4097, 1<<20), rapid.Uint64Range(1<<20+1, 5<<20))
		pick := func() (int, pool.Block) {
			i := rapid.IntRange(0, len(blocks)-1).Draw(rt, "i")
			return i, blocks[i]
		}
		freed := func(i int) {
			b := blocks[i]
			blocks = append(blocks[:i], blocks[i+1:]...)
			if len(stale) == 8 {
				stale = stale[1:]
			}
			stale = append(stale, b)
		}
		// run runs fs at once, each on its own goroutine, within the bound.
		run := func(what string, fs ...func()) {
			var start, wg sync.WaitGroup
			start.Add(1)
			for _, f := range fs {
				wg.Add(1)
				go func() { defer wg.Done(); start.Wait(); f() }()
			}
			start.Done()
			watchdog.Within(rt, watchdog.Bound, what, wg.Wait)
		}
		for range concurrentModelSteps {
			steps.Add(1)
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op <= 3 || len(blocks) == 0 && op <= 7:
				var b pool.Block
				var err error
				n := memapi.Bytes(sizes.Draw(rt, "size"))
				watchdog.Within(rt, watchdog.Bound, "Alloc", func() { b, err = e.p.Alloc(ctx, n, nil) })
				if err != nil {
					// Injected growth faults, the budget, a quarantine
					// not yet removed, or Options.Wait (short here, so
					// that an over-budget growth fails soon) ending
					// before a region transaction began.
					require.True(rt, errors.Is(err, memapi.ErrOutOfMemory) || errors.Is(err, memapi.ErrOverBudget) ||
						errors.Is(err, ep.ErrQuarantined) || errors.Is(err, context.DeadlineExceeded), "unexpected error %v", err)
					break
				}
				if rapid.Bool().Draw(rt, "fence") {
					f := &flagFence{}
					f.done.Store(rapid.Bool().Draw(rt, "fence done"))
					fences = append(fences, f)
					require.NoError(rt, b.RecordStreamUse(f))
				}
				blocks = append(blocks, b)
			case op == 4:
				i, b := pick()
				var err error
				run("a Free on another goroutine", func() { err = b.Free() })
				require.NoError(rt, err)
				freed(i)
			case op == 5:
				i, b := pick()
				errs := make([]error, 2)
				run("two racing Frees", func() { errs[0] = b.Free() }, func() { errs[1] = b.Free() })
				require.True(rt, (errs[0] == nil) != (errs[1] == nil), "one Free wins: %v, %v", errs[0], errs[1])
				for _, err := range errs {
					if err != nil {
						require.ErrorIs(rt, err, pool.ErrDoubleFree)
					}
				}
				freed(i)
			case op == 6:
				if len(stale) == 0 {
					break
				}
				_, b := pick()
				old := stale[rapid.IntRange(0, len(stale)-1).Draw(rt, "stale")]
				f := &flagFence{}
				f.done.Store(true)
				fences = append(fences, f)
				var rerr, ferr error
				run("RecordUse racing a stale Free", func() { rerr = b.RecordUse(f) }, func() { ferr = old.Free() })
				require.NoError(rt, rerr)
				require.ErrorIs(rt, ferr, pool.ErrDoubleFree)
				require.Equal(rt, ep.Open, b.State(), "a stale Free touched the block's owner")
			case op == 7:
				want := memapi.Bytes(rapid.Uint64Range(1, 32<<20).Draw(rt, "wanted"))
				var err error
				watchdog.Within(rt, watchdog.Bound, "Reclaim", func() {
					_, err = e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: want})
				})
				noErrorButQuarantine(rt, err)
			case op == 8:
				var err error
				watchdog.Within(rt, watchdog.Bound, "Trim", func() { _, err = e.p.Trim(ctx) })
				noErrorButQuarantine(rt, err)
			default:
				for _, f := range fences {
					f.done.Store(true) // the device work completes
				}
			}
			e.checkLedger(rt)
		}
		for _, f := range fences {
			f.done.Store(true)
		}
		for _, b := range blocks {
			require.NoError(rt, b.Free())
		}
		// Close while a huge growth's Allocate runs (when it gets there: a
		// growth fault may fail it first). The checked wrapper serializes
		// the mechanism's calls, so the blocked Allocate would block a
		// release Close makes: the pool holds nothing then (segments,
		// after a Trim), and a region pool, whose Close releases the
		// region, closes without a growth in flight.
		var terr error
		watchdog.Within(rt, watchdog.Bound, "Trim", func() { _, terr = e.p.Trim(ctx) })
		noErrorButQuarantine(rt, terr)
		if backing == pool.BackingRegion || e.p.Stats().Segments != 0 {
			noErrorButQuarantine(rt, e.p.Close())
		} else {
			closeDuringGrowth(rt, e, &armed, entered, resume)
		}
		e.checkLedger(rt)
		e.m.ClearFaults()
		require.NoError(rt, e.p.Close())
		s := e.checkLedger(rt)
		require.Zero(rt, s.Segments)
		require.Zero(rt, s.Quarantined)
		require.Zero(rt, e.m.UsedBytes())
		require.Zero(rt, e.holder("pool").Charged)
	})
}

// closeDuringGrowth closes the pool while a huge growth's Allocate runs
// (blocked there once armed), when the growth gets that far (a growth
// fault may fail it first): the growth then gives its new segment back
// itself, memapi.ErrClosed, and a release of it that fails stays visible.
func closeDuringGrowth(rt *rapid.T, e *env, armed *atomic.Bool, entered, resume chan struct{}) {
	armed.Store(true)
	errc := make(chan error, 1)
	go func() {
		_, err := e.p.Alloc(context.Background(), 6<<20, nil)
		errc <- err
	}()
	var err error
	gotThere := false
	watchdog.Within(rt, watchdog.Bound, "the growth", func() {
		select {
		case <-entered:
			gotThere = true
		case err = <-errc:
		}
	})
	if !gotThere {
		armed.Store(false)
		require.Error(rt, err, "a growth with its Allocate blocked returned a block")
		noErrorButQuarantine(rt, e.p.Close())
		return
	}
	require.NoError(rt, e.p.Close())
	close(resume)
	err = watchdog.Recv(rt, watchdog.Bound, "the growth Close interrupted", errc)
	require.ErrorIs(rt, err, memapi.ErrClosed)
	e.checkLedger(rt)
	noErrorButQuarantine(rt, e.p.Close())
}
