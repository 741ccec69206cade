package pool_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestGrowthTakesAChunkFreedWhileItWaits: a request that must grow while
// the pool's blocks hold the whole budget waits for other holders' refunds
// (up to Options.Wait, a minute here). A block of the pool freed meanwhile
// goes to the pool's cache, not back to the governor, so the wait would
// end over budget; instead the freed chunk ends the wait and the request
// takes it: served, with no segment added and no growth counted as failed.
func TestGrowthTakesAChunkFreedWhileItWaits(t *testing.T) {
	for _, backing := range []pool.Backing{pool.BackingSegments, pool.BackingRegion} {
		t.Run(string(backing), func(t *testing.T) {
			e := setupWith(t, 8<<20, pool.Options{Backing: backing, SegmentBytes: 2 << 20, Wait: time.Minute},
				fakes.Config{Granularity: 64 << 10})
			ctx := context.Background()
			full := allocAll(t, e.p, 4, 2<<20) // the whole budget
			before := e.checkLedger(t)
			tickets := e.holder("pool").Tickets

			var got pool.Block
			errc := make(chan error, 1)
			go func() {
				var err error
				got, err = e.p.Alloc(ctx, 2<<20, nil)
				errc <- err
			}()
			// The growth has asked the pool's own cache, which had nothing
			// to give: it waits for the governor.
			e.awaitTicket(t, tickets, "the growth's ticket to the pool")
			require.NoError(t, full[0].Free())
			var err error
			watchdog.Within(t, watchdog.Bound, "the waiting request", func() { err = <-errc })
			require.NoError(t, err, "the request was not served from the chunk freed while it waited")

			after := e.checkLedger(t)
			require.Equal(t, before.Segments, after.Segments, "no segment added")
			require.Equal(t, before.SegmentAllocs, after.SegmentAllocs)
			require.Zero(t, after.OverBudget, "no growth counted as failed")
			require.Equal(t, memapi.Bytes(8<<20), after.InUse, "the four blocks")
			freeAll(t, append(full[1:], got))
			e.checkLedger(t)
		})
	}
}
