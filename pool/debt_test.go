package pool_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestTicketAnsweredShortIsPaidByALaterFree: another holder's reservation
// asks the pool while every block is in use, so the pool answers its
// ticket with nothing. A block freed a moment later, while that
// reservation still waits, makes a segment wholly free: the pool gives it
// back at once instead of caching it, and the reservation is served.
// Without it the reservation fails over budget after its wait (the
// governor's default, 30 s) while the pool caches the bytes it asked
// for. Large blocks (their segment then one free chunk) and huge blocks
// (a segment each) pay so.
func TestTicketAnsweredShortIsPaidByALaterFree(t *testing.T) {
	for _, c := range []struct {
		name string
		size memapi.Bytes
	}{{"large", 2 << 20}, {"huge", 4 << 20}} {
		t.Run(c.name, func(t *testing.T) {
			e := setupWith(t, 8<<20, pool.Options{Backing: pool.BackingSegments, SegmentBytes: 2 << 20, HugeBytes: 4 << 20},
				fakes.Config{Granularity: 64 << 10})
			ctx := context.Background()
			n := 8 << 20 / c.size
			full := allocAll(t, e.p, int(n), c.size) // the whole budget, in use
			before := e.checkLedger(t)
			require.Zero(t, before.Cached)

			require.NoError(t, e.g.Register("other", nil, governor.HolderOptions{}))
			ob, err := e.mgr.Bind("other", "data", dev0)
			require.NoError(t, err)
			tickets := e.holder("pool").Tickets
			var buf *pmm.Buffer
			errc := make(chan error, 1)
			go func() {
				var err error
				// No deadline: the governor's default wait (30 s) bounds
				// it, and the ticket's context is the governor's own.
				buf, err = ob.Allocate(ctx, c.size)
				errc <- err
			}()
			e.awaitTicket(t, tickets, "the pool's ticket")
			require.Zero(t, e.holder("pool").Freed, "everything was in use: the ticket was answered with nothing")

			require.NoError(t, full[0].Free())
			watchdog.Within(t, watchdog.Bound, "the waiting reservation", func() { err = <-errc })
			require.NoError(t, err, "the reservation was not served from the segment freed while it waited")

			e.drain(t)
			after := e.p.Stats()
			require.Equal(t, before.Segments-c.size, after.Segments, "the freed segment went back")
			require.Zero(t, after.Cached)
			require.Equal(t, after.Segments, e.holder("pool").Charged)
			require.Equal(t, after.Segments+buf.Size(), e.m.UsedBytes())
			require.NoError(t, buf.Close())
			freeAll(t, full[1:])
			require.NoError(t, ob.Close())
			e.checkLedger(t)

			// Paid: a later free caches again.
			again := allocAll(t, e.p, 1, c.size)
			segs := e.p.Stats().Segments
			require.NoError(t, again[0].Free())
			require.Equal(t, segs, e.p.Stats().Segments, "a free with nothing owed caches")
		})
	}
}

// TestDebtEndsWithTheReservationsWait: a ticket answered short leaves a
// debt only while its reservation waits. Once the reservation gives up
// (its context cancelled) before anything came free, a free that makes a
// segment wholly free caches it as usual: nobody waits for those bytes,
// and giving them back would only make the pool grow again.
func TestDebtEndsWithTheReservationsWait(t *testing.T) {
	for _, c := range []struct {
		name string
		size memapi.Bytes
	}{{"large", 2 << 20}, {"huge", 4 << 20}} {
		t.Run(c.name, func(t *testing.T) {
			e := setupWith(t, 8<<20, pool.Options{Backing: pool.BackingSegments, SegmentBytes: 2 << 20, HugeBytes: 4 << 20},
				fakes.Config{Granularity: 64 << 10})
			n := 8 << 20 / c.size
			full := allocAll(t, e.p, int(n), c.size) // the whole budget, in use

			require.NoError(t, e.g.Register("other", nil, governor.HolderOptions{}))
			ob, err := e.mgr.Bind("other", "data", dev0)
			require.NoError(t, err)
			tickets := e.holder("pool").Tickets
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() {
				_, err := ob.Allocate(ctx, c.size)
				errc <- err
			}()
			e.awaitTicket(t, tickets, "the pool's ticket")
			require.Zero(t, e.holder("pool").Freed, "everything was in use: the ticket was answered with nothing")
			cancel()
			watchdog.Within(t, watchdog.Bound, "the cancelled reservation", func() { err = <-errc })
			require.ErrorIs(t, err, context.Canceled)

			segs := e.p.Stats().Segments
			require.NoError(t, full[0].Free())
			e.drain(t)
			after := e.p.Stats()
			require.Equal(t, segs, after.Segments, "a free after the reservation gave up gave its segment back")
			require.Equal(t, c.size, after.Cached)
			freeAll(t, full[1:])
			require.NoError(t, ob.Close())
			e.checkLedger(t)
		})
	}
}

// TestAFreeServesThePoolsOwnGrowthBeforeItsDebt: while the pool owes
// another holder's waiting reservation, a request of the pool's own
// waits to grow too. A free that makes a segment wholly free serves the
// pool's request, which the chunk fits (as a cache hit a moment later
// would), instead of going back to the governor: the memory goes to use,
// not through an unmap and a map again, and the other reservation waits
// for the next free.
func TestAFreeServesThePoolsOwnGrowthBeforeItsDebt(t *testing.T) {
	e := setupWith(t, 8<<20, pool.Options{Backing: pool.BackingSegments, SegmentBytes: 2 << 20, HugeBytes: 4 << 20, Wait: 5 * time.Second},
		fakes.Config{Granularity: 64 << 10})
	full := allocAll(t, e.p, 4, 2<<20) // the whole budget, in use
	before := e.checkLedger(t)

	require.NoError(t, e.g.Register("other", nil, governor.HolderOptions{}))
	ob, err := e.mgr.Bind("other", "data", dev0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tickets := e.holder("pool").Tickets
	otherc := make(chan error, 1)
	go func() {
		_, err := ob.Allocate(ctx, 2<<20)
		otherc <- err
	}()
	e.awaitTicket(t, tickets, "the other reservation's ticket")
	var got pool.Block
	ownc := make(chan error, 1)
	go func() {
		var err error
		got, err = e.p.Alloc(context.Background(), 2<<20, nil)
		ownc <- err
	}()
	e.awaitTicket(t, tickets+1, "the pool's own growth's ticket")
	require.Zero(t, e.holder("pool").Freed, "everything was in use: both tickets were answered with nothing")

	require.NoError(t, full[0].Free())
	watchdog.Within(t, watchdog.Bound, "the pool's waiting request", func() { err = <-ownc })
	require.NoError(t, err, "the pool's request was not served from the chunk freed while it waited")
	select {
	case err := <-otherc:
		t.Fatalf("the other reservation ended (%v): the free went to the governor, not to the pool's request", err)
	default:
	}
	after := e.p.Stats()
	require.Equal(t, before.Segments, after.Segments, "no segment given back or added")
	require.Equal(t, before.SegmentAllocs, after.SegmentAllocs)

	cancel()
	watchdog.Within(t, watchdog.Bound, "the cancelled reservation", func() { err = <-otherc })
	require.ErrorIs(t, err, context.Canceled)
	freeAll(t, append(full[1:], got))
	require.NoError(t, ob.Close())
	e.checkLedger(t)
}
