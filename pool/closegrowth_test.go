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

// TestCloseDuringGrowthKeepsFailedRelease: the pool is closed while a
// segment growth's Allocate runs (no pool lock is held there). The growth
// then closes the new segment itself; when that release fails, its bytes
// stay visible in the pool's Stats (quarantined), as in pmm and the
// governor, and the next Close retries it until the mechanism holds none.
func TestCloseDuringGrowthKeepsFailedRelease(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{SegmentBytes: 2 << 20})
	ctx := context.Background()
	entered, resume := make(chan struct{}), make(chan struct{})
	var once bool
	e.m.Inject(fakes.Fault{Method: "Allocate", When: func(fakes.Call) bool {
		if !once {
			once = true
			close(entered)
			<-resume
		}
		return false
	}, Err: memapi.ErrOutOfMemory})
	e.m.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrUnavailable})
	errc := make(chan error, 1)
	go func() {
		_, err := e.p.Alloc(ctx, 4096, nil)
		errc <- err
	}()
	watchdog.Within(t, 10*time.Second, "the growth's Allocate", func() { <-entered })
	require.NoError(t, e.p.Close())
	close(resume)
	var err error
	watchdog.Within(t, 10*time.Second, "Alloc", func() { err = <-errc })
	require.ErrorIs(t, err, memapi.ErrClosed)
	s := e.checkLedger(t)
	require.Zero(t, s.Segments)
	require.Equal(t, memapi.Bytes(2<<20), s.Quarantined, "the failed release stays in the pool's figures")

	// Close retries it: failing again it stays, then it goes.
	noErrorButQuarantine(t, e.p.Close())
	require.Equal(t, memapi.Bytes(2<<20), e.checkLedger(t).Quarantined)
	e.m.ClearFaults()
	require.NoError(t, e.p.Close())
	s = e.checkLedger(t)
	require.Zero(t, s.Quarantined)
	require.Zero(t, e.m.UsedBytes())
	require.Zero(t, e.holder("pool").Charged)
}

// TestNewFailsWhenTheRegionCannotBeReserved: a BackingRegion pool reserves
// its region's addresses in New; when the reservation fails, New returns
// the mechanism's error and leaves nothing behind (no handle, no charge),
// and a New after it succeeds.
func TestNewFailsWhenTheRegionCannotBeReserved(t *testing.T) {
	e := setupWith(t, 1<<30, pool.Options{Backing: pool.BackingRegion}, fakes.Config{Granularity: 64 << 10})
	require.NoError(t, e.p.Close())
	e.drain(t)
	require.Zero(t, e.m.LiveHandles())
	b := e.p.Binding()
	e.m.Inject(fakes.Fault{Method: "Reserve", Err: memapi.ErrOutOfMemory})
	p, err := pool.New(b, pool.Options{Backing: pool.BackingRegion})
	require.ErrorIs(t, err, memapi.ErrOutOfMemory)
	require.Nil(t, p)
	e.drain(t)
	require.Zero(t, e.m.LiveHandles(), "nothing reserved")
	require.Zero(t, e.holder("pool").Charged)

	e.m.ClearFaults()
	p, err = pool.New(b, pool.Options{Backing: pool.BackingRegion})
	require.NoError(t, err)
	require.Equal(t, 1, e.m.LiveHandles(), "the region's reservation")
	blk, err := p.Alloc(context.Background(), 4096, nil)
	require.NoError(t, err)
	require.NoError(t, blk.Free())
	require.NoError(t, p.Close())
	e.drain(t)
	require.Zero(t, e.m.LiveHandles())
	require.Zero(t, e.holder("pool").Charged)
}

// TestCloseKeepsTheRegionWhoseReleaseFails: when the release of the
// region's reservation fails at Close, the region stays the closed pool's,
// and the next Close retries its release until the mechanism holds no
// handle.
func TestCloseKeepsTheRegionWhoseReleaseFails(t *testing.T) {
	e := setupWith(t, 1<<30, pool.Options{Backing: pool.BackingRegion}, fakes.Config{Granularity: 64 << 10})
	blk, err := e.p.Alloc(context.Background(), 4096, nil)
	require.NoError(t, err)
	require.NoError(t, blk.Free())
	e.m.Inject(fakes.Fault{Method: "ReleaseReservation", Err: memapi.ErrUnavailable})
	noErrorButQuarantine(t, e.p.Close())
	e.drain(t)
	require.Equal(t, 1, e.m.LiveHandles(), "the reservation's release failed: the mechanism still holds it")

	noErrorButQuarantine(t, e.p.Close())
	e.drain(t)
	require.Equal(t, 1, e.m.LiveHandles())
	e.m.ClearFaults()
	require.NoError(t, e.p.Close())
	e.drain(t)
	require.Zero(t, e.m.LiveHandles(), "Close retried the region's release")
	e.checkLedger(t)
}
