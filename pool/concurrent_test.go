package pool_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestConcurrentUse: goroutines allocating and freeing small, large and
// huge blocks (each writing and checking its own pattern), one asking the
// pool to Reclaim and Trim and reading Stats, with release faults
// injected, on both backings under a budget that the live blocks can fill.
// Run under -race; every Stats meanwhile has Cached + InUse == Segments; at
// the end the ledger identity holds and a Close and its retry leave
// nothing.
func TestConcurrentUse(t *testing.T) {
	for _, c := range []struct {
		name    string
		backing pool.Backing
		slack   float64
	}{{"segments", pool.BackingSegments, 0}, {"region", pool.BackingRegion, 0}, {"region-holes", pool.BackingRegion, 1e-9}} {
		backing := c.backing
		t.Run(c.name, func(t *testing.T) {
			// region-holes: every whole free granule is decommitted before
			// the committed bytes rise, so blocks are placed in holes
			// (recommitted) while other goroutines free and trim.
			e := setup(t, 256<<20, pool.Options{Backing: backing, HugeBytes: 4 << 20, HoleSlack: c.slack})
			for _, m := range []string{"Free", "Decommit"} {
				e.m.Inject(rateFault(m, 20, memapi.ErrUnavailable))
			}
			ctx := context.Background()
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			stop := make(chan struct{})
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 1))
					type lv struct {
						b    pool.Block
						seed int
					}
					var live []lv
					for i := range 400 {
						if len(live) > 0 && r.IntN(2) == 0 {
							k := r.IntN(len(live))
							l := live[k]
							got := make([]byte, 64)
							if err := e.m.ReadMemory(l.b.Addr(), got); err != nil {
								errs <- err
								return
							}
							if string(got) != string(pattern(l.seed, 64)) {
								errs <- &memapi.Error{Op: "test", Kind: memapi.ErrInUse, Detail: "a live block was overwritten"}
								return
							}
							if err := l.b.Free(); err != nil {
								errs <- err
								return
							}
							live = append(live[:k], live[k+1:]...)
							continue
						}
						var n memapi.Bytes
						switch r.IntN(10) {
						case 0:
							n = memapi.Bytes(4<<20 + r.Uint64N(2<<20))
						case 1, 2, 3:
							n = memapi.Bytes(64<<10 + r.Uint64N(1<<20))
						default:
							n = memapi.Bytes(64 + r.Uint64N(64<<10))
						}
						b, err := e.p.Alloc(ctx, n, nil)
						if err != nil {
							continue // over budget: the others hold it
						}
						seed := g*10000 + i
						if err := e.m.WriteMemory(b.Addr(), pattern(seed, 64)); err != nil {
							errs <- err
							return
						}
						live = append(live, lv{b, seed})
					}
					for _, l := range live {
						if err := l.b.Free(); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			var pressure sync.WaitGroup
			pressure.Add(1)
			go func() {
				defer pressure.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 8 << 20})
					_, _ = e.p.Trim(ctx)
					// Stats holds every level's lock: a byte moving between
					// levels (or into use) is never seen in neither or both,
					// even mid-flight.
					for range 20 {
						if s := e.p.Stats(); s.Cached+s.InUse != s.Segments {
							select {
							case errs <- fmt.Errorf("mid-flight Stats: cached %d + in use %d != segments %d", s.Cached, s.InUse, s.Segments):
							default:
							}
							return
						}
					}
				}
			}()
			watchdog.Within(t, watchdog.Bound, "the workers", wg.Wait)
			close(stop)
			pressure.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			s := e.checkLedger(t)
			require.Zero(t, s.InUse)
			require.Zero(t, s.Requested)
			require.Equal(t, s.Allocs, s.Frees)
			if c.slack > 0 {
				require.NotZero(t, s.Recommits, "no block was placed in a hole")
				require.NotZero(t, s.Decommits)
			}
			require.NoError(t, e.p.Close())
			e.m.ClearFaults()
			require.NoError(t, e.p.Close())
			s = e.checkLedger(t)
			require.Zero(t, s.Segments+s.Quarantined)
			require.Zero(t, e.m.UsedBytes())
		})
	}
}
