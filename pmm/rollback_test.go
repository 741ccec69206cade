package pmm_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A rollback that fails after the grant could not commit (Allocate's Free,
// CreateShared's and CopyOnWrite's ReleaseBacking) kept the drawn bytes in
// the open grant: visible as reserved, but nothing ever retried them, so
// the ledger never returned to zero. Now the leftover is quarantined on the
// context: visible and pinned while the fault lasts, freed and the grant
// cancelled by RetryQuarantined or Manager.Close once it clears.
func TestFailedRollbackIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		bytes  memapi.Bytes
		// fail makes the failing call, arming the faults just before it.
		fail func(t *testing.T, e *env, arm func()) error
	}{
		{"allocate", "Free", 4096, func(t *testing.T, e *env, arm func()) error {
			b := e.bind(t, "w", "weights")
			arm()
			_, err := b.Allocate(context.Background(), 4096)
			return err
		}},
		{"create-shared", "ReleaseBacking", gran, func(t *testing.T, e *env, arm func()) error {
			b := e.bind(t, "p", "prompt")
			arm()
			_, err := b.CreateShared(context.Background(), gran)
			return err
		}},
		{"copy-on-write", "ReleaseBacking", gran, func(t *testing.T, e *env, arm func()) error {
			ctx := context.Background()
			b := e.bind(t, "p", "kv")
			sh, err := b.CreateShared(ctx, gran)
			require.NoError(t, err)
			r, err := b.ReserveVirtual(ctx, 4*gran)
			require.NoError(t, err)
			_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, sh.Close()) })
			arm()
			return r.CopyOnWrite(ctx, 0)
		}},
	} {
		for _, settle := range []string{"retry", "manager-close"} {
			t.Run(tc.name+"/"+settle, func(t *testing.T) {
				e := setup(t, fakes.Config{})
				var (
					base figures
					used memapi.Bytes
				)
				err := tc.fail(t, e, func() {
					base, used = e.l.snapshot(), e.m.UsedBytes()
					e.l.failCommit = -1
					e.m.Inject(fakes.Fault{Method: tc.method, Err: memapi.ErrUnavailable})
				})
				require.ErrorIs(t, err, ep.ErrQuarantined)
				require.ErrorIs(t, err, errInjected)
				stuck := figures{Reserved: tc.bytes, Drawn: tc.bytes}
				base.Reserved += tc.bytes
				base.Drawn += tc.bytes
				require.Equal(t, base, e.l.snapshot(), "visible while stuck: reserved and drawn")
				require.Equal(t, used+tc.bytes, e.m.UsedBytes())
				require.Equal(t, 1, e.ectx.Quarantined(), "reachable for a retry")
				require.ErrorIs(t, e.ectx.QuarantineErrors()[0], ep.ErrQuarantined)
				// A retry while the fault lasts keeps everything visible.
				require.NoError(t, e.ectx.RetryQuarantined())
				e.drain(t)
				require.Equal(t, base, e.l.snapshot())
				e.m.ClearFaults()
				e.l.failCommit = 0
				if settle == "retry" {
					require.NoError(t, e.ectx.RetryQuarantined())
					e.drain(t)
				} else {
					err := e.mgr.Close(context.Background())
					if tc.name != "copy-on-write" { // which still holds its region and backing
						require.NoError(t, err)
					}
				}
				base.Reserved -= stuck.Reserved
				base.Drawn -= stuck.Drawn
				require.Equal(t, base, e.l.snapshot(), "the leftover was freed and its grant cancelled")
				require.Equal(t, used, e.m.UsedBytes())
				require.Zero(t, e.ectx.Quarantined())
			})
		}
	}
}

// The retry of a failed rollback whose free succeeded but whose grant
// cancel failed only cancels the next time: it never frees twice.
func TestFailedRollbackRetryCancelsOnly(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "w", "weights")
	e.l.failCommit = -1
	e.m.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrUnavailable})
	_, err := b.Allocate(context.Background(), 4096)
	require.ErrorIs(t, err, ep.ErrQuarantined)
	e.m.ClearFaults()
	e.l.failCommit = 0
	e.l.failCancel = e.l.cancels + 1
	require.NoError(t, e.ectx.RetryQuarantined())
	e.drain(t)
	require.Equal(t, figures{Reserved: 4096}, e.l.snapshot(), "freed into the grant, which is still open")
	require.Zero(t, e.m.UsedBytes())
	require.Equal(t, 1, e.ectx.Quarantined())
	require.NoError(t, e.ectx.RetryQuarantined())
	e.settled(t)
	require.Zero(t, e.ectx.Quarantined())
	require.Equal(t, 2, e.m.FreeCallCount(), "one failed free, then one that freed: never twice")
}

// A leftover the device context refuses to pin (it is closed, or its queue
// is closing) is kept all the same: a failed rollback (its bytes drawn
// from the open grant) or an allocation the context refused to own whose
// free failed (its bytes charged, quarantined). It is listed by the
// context, pins nothing (the context closed), and Manager.Close frees it
// once the fault clears, reporting it (ep.ErrQuarantined) while it lasts.
func TestLeftoverOfAClosedContextIsRetriedByManagerClose(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		bytes        memapi.Bytes
		commitFails  bool // the grant cannot commit: a failed rollback
		make         func(b *pmm.Binding) error
	}{
		{"allocate/rollback", "Free", 4096, true, func(b *pmm.Binding) error {
			_, err := b.Allocate(context.Background(), 4096)
			return err
		}},
		{"allocate/refused", "Free", 4096, false, func(b *pmm.Binding) error {
			_, err := b.Allocate(context.Background(), 4096)
			return err
		}},
		{"create-shared/rollback", "ReleaseBacking", gran, true, func(b *pmm.Binding) error {
			_, err := b.CreateShared(context.Background(), gran)
			return err
		}},
		{"create-shared/refused", "ReleaseBacking", gran, false, func(b *pmm.Binding) error {
			_, err := b.CreateShared(context.Background(), gran)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			ctx := context.Background()
			b := e.bind(t, "w", "weights")
			require.NoError(t, e.ectx.Close(ctx, false))
			if tc.commitFails {
				e.l.failCommit = -1
			}
			e.m.Inject(fakes.Fault{Method: tc.method, Err: memapi.ErrUnavailable})
			err := tc.make(b)
			require.ErrorIs(t, err, ep.ErrQuarantined)
			stuck := figures{Reserved: tc.bytes, Drawn: tc.bytes}
			if !tc.commitFails {
				require.ErrorIs(t, err, memapi.ErrClosed, "the context refused the handle")
				stuck = figures{Charged: tc.bytes, Quarantined: tc.bytes}
			}
			require.Equal(t, stuck, e.l.snapshot(), "visible while stuck")
			require.Equal(t, tc.bytes, e.m.UsedBytes())
			require.Equal(t, 1, e.ectx.Quarantined(), "kept by the context")
			require.Zero(t, e.ectx.Live(), "pinning nothing")
			require.ErrorIs(t, e.mgr.Close(ctx), ep.ErrQuarantined, "reported while the fault lasts")
			require.Equal(t, stuck, e.l.snapshot())
			require.Equal(t, 1, e.ectx.Quarantined())
			e.m.ClearFaults()
			e.l.failCommit = 0
			require.NoError(t, e.mgr.Close(ctx))
			require.Zero(t, e.ectx.Quarantined())
			e.settled(t)
		})
	}
}

// Allocations whose rollback (or whose free once the context refused them)
// fails the first time, racing the context's Close: whatever the
// interleaving, nothing is lost. Before Manager.Close the ledger's figures
// equal the mechanism's and every leftover is listed by the context;
// Manager.Close frees them all and everything is 0.
func TestFailedRollbacksRacingContextClose(t *testing.T) {
	e := setup(t, fakes.Config{})
	ctx := context.Background()
	b := e.bind(t, "w", "weights")
	e.l.mu.Lock()
	e.l.failCommitIf = func(n int) bool { return n%2 == 1 }
	e.l.mu.Unlock()
	var mu sync.Mutex
	failed := map[*memapi.Allocation]bool{}
	e.m.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrUnavailable, When: func(c fakes.Call) bool {
		a := c.Args[1].(*memapi.Allocation)
		mu.Lock()
		defer mu.Unlock()
		first := !failed[a]
		failed[a] = true
		return first
	}})
	stop := make(chan struct{})
	var retries sync.WaitGroup
	retries.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = e.ectx.RetryQuarantined()
			time.Sleep(100 * time.Microsecond)
		}
	})
	var closed atomic.Bool
	var workers sync.WaitGroup
	for range 4 {
		workers.Go(func() {
			for after := 0; after < 20; {
				if closed.Load() {
					after++ // the context refuses these
				} else {
					time.Sleep(200 * time.Microsecond) // let the pins reach zero now and then
				}
				buf, err := b.Allocate(ctx, 4096)
				if err == nil {
					assert.NoError(t, buf.Close())
					continue
				}
				assert.ErrorIs(t, err, ep.ErrQuarantined)
			}
		})
	}
	time.Sleep(time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	// A Close that saw the pins reach zero and then pinned again meanwhile
	// gives up (ErrInUse); it is called again.
	for err := e.ectx.Close(ctx, false); err != nil; err = e.ectx.Close(ctx, false) {
		require.ErrorIs(t, err, memapi.ErrInUse)
		require.True(t, time.Now().Before(deadline), "the context never closed")
		time.Sleep(50 * time.Microsecond)
	}
	close(stop) // nothing retries the leftovers made from now on but Manager.Close
	retries.Wait()
	closed.Store(true)
	workers.Wait()

	f := e.l.snapshot()
	require.Zero(t, f.Pending)
	require.Equal(t, e.m.UsedBytes(), f.Drawn+f.Charged, "the ledger equals the mechanism")
	require.LessOrEqual(t, f.Drawn, f.Reserved)
	require.LessOrEqual(t, f.Quarantined, f.Charged)
	require.Zero(t, e.ectx.Live())
	require.GreaterOrEqual(t, e.ectx.Quarantined(), 4*20, "the leftovers made after Close are listed")
	require.NoError(t, e.mgr.Close(ctx))
	require.Zero(t, e.ectx.Quarantined())
	e.settled(t)
}

// A cancel that fails after the mechanism refused the allocation keeps the
// grant: reserved (visible), listed on the context, and cancelled by the
// next retry once the fault clears; both errors reach the caller. It used
// to be dropped: 4 KiB reserved for good, behind a Manager.Close that
// returned nil.
func TestFailedCancelAfterFailedAllocateIsRetried(t *testing.T) {
	for _, settle := range []string{"retry", "manager-close"} {
		t.Run(settle, func(t *testing.T) {
			e := setup(t, fakes.Config{})
			b := e.bind(t, "w", "weights")
			base := e.l.snapshot()
			e.m.Inject(fakes.Fault{Method: "Allocate", Err: memapi.ErrUnavailable})
			e.l.failCancel = e.l.cancels + 1
			_, err := b.Allocate(context.Background(), 4096)
			require.ErrorIs(t, err, memapi.ErrUnavailable, "the mechanism's error")
			require.ErrorIs(t, err, errInjected, "the cancel's error")
			require.ErrorIs(t, err, ep.ErrQuarantined)
			stuck := base
			stuck.Reserved += 4096
			require.Equal(t, stuck, e.l.snapshot(), "the grant stays reserved, visible")
			require.Equal(t, 1, e.ectx.Quarantined(), "reachable for a retry")
			e.m.ClearFaults()
			if settle == "retry" {
				require.NoError(t, e.ectx.RetryQuarantined())
				e.drain(t)
			} else {
				require.NoError(t, e.mgr.Close(context.Background()))
			}
			require.Equal(t, base, e.l.snapshot(), "the grant was cancelled")
			require.Zero(t, e.ectx.Quarantined())
			require.Zero(t, e.m.UsedBytes())
		})
	}
}
