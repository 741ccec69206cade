package pool_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestReclaimNeverWaitsForGrowth: a Reclaim or Trim that comes while the
// region grows (the growth may be the very reservation that asked) gives
// what it can without the region and returns at once; it never waits for
// the growth, which would deadlock a growth that waits for its ticket.
func TestReclaimNeverWaitsForGrowth(t *testing.T) {
	e := setupWith(t, 1<<30, pool.Options{Backing: pool.BackingRegion, SegmentBytes: 1 << 20}, fakes.Config{Granularity: 64 << 10})
	ctx := context.Background()
	b, err := e.p.Alloc(ctx, 512<<10, nil)
	require.NoError(t, err)
	require.NoError(t, b.Free()) // a free tail to give

	entered, resume := make(chan struct{}), make(chan struct{})
	var once bool
	e.m.Inject(fakes.Fault{Method: "Commit", When: func(fakes.Call) bool {
		if !once {
			once = true
			close(entered)
			<-resume
		}
		return false
	}, Err: memapi.ErrOutOfMemory})
	var big pool.Block
	errc := make(chan error, 1)
	go func() {
		var err error
		big, err = e.p.Alloc(ctx, 4<<20, nil) // grows the region
		errc <- err
	}()
	watchdog.Within(t, watchdog.Bound, "the growth's Commit", func() { <-entered })
	watchdog.Within(t, 5*time.Second, "Reclaim during the growth", func() {
		n, err := e.p.Reclaim(ctx, governor.Ticket{Authority: auth, Wanted: 1 << 20})
		require.NoError(t, err)
		require.Zero(t, n, "the region is the growth's until it ends")
	})
	watchdog.Within(t, 5*time.Second, "Trim during the growth", func() {
		_, err := e.p.Trim(ctx)
		require.NoError(t, err)
	})
	close(resume)
	watchdog.Within(t, watchdog.Bound, "the growth", func() { err = <-errc })
	require.NoError(t, err)
	require.NoError(t, big.Free())
	e.checkLedger(t)
}
