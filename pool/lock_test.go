package pool_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// panicFence is a caller's fence whose second Done panics (a driver fence
// of a torn-down context, say); it is done from the third on.
type panicFence struct{ calls atomic.Int32 }

func (f *panicFence) Done() bool {
	switch f.calls.Add(1) {
	case 1:
		return false
	case 2:
		panic("fence: context destroyed")
	}
	return true
}
func (f *panicFence) Wait(context.Context) error { return nil }
func (f *panicFence) Ready() <-chan struct{}     { return nil }

// flagFence is a caller's fence done once set.
type flagFence struct{ done atomic.Bool }

func (f *flagFence) Done() bool                 { return f.done.Load() }
func (f *flagFence) Wait(context.Context) error { return nil }
func (f *flagFence) Ready() <-chan struct{}     { return nil }

// TestPanicInLockedSectionReleasesLocks: the pool polls a caller's fences
// under its mutex (sweeping pending blocks). A fence that panics there must
// not leave the mutex held (every later call, Close included, would hang)
// nor the pending list half rewritten (a block swept before the panic gone
// from it, none twice): the panic reaches the caller, and the pool goes on,
// exact.
func TestPanicInLockedSectionReleasesLocks(t *testing.T) {
	for _, size := range []uint64{4 << 20, 4096} {
		e := setup(t, 1<<30, pool.Options{})
		ctx := context.Background()
		s, err := e.fctx.NewStream()
		require.NoError(t, err)
		// Pending in this order: a (done by the sweep), b (not done), c
		// (panics).
		fa, fb, fc := &flagFence{}, &flagFence{}, &panicFence{}
		for _, f := range []memapi.Fence{fa, fb, fc} {
			blk, err := e.p.Alloc(ctx, memBytes(size), s)
			require.NoError(t, err)
			require.NoError(t, blk.RecordStreamUse(f))
			require.NoError(t, blk.Free()) // fc: Done #1, pending
		}
		fa.done.Store(true)
		watchdog.Within(t, 10*time.Second, "Alloc", func() {
			require.Panics(t, func() {
				// Drain the shards and the depot so the slow path, which
				// sweeps the pending list, runs.
				var got []pool.Block
				defer func() {
					for _, g := range got {
						_ = g.Free()
					}
				}()
				for range 100000 {
					g, err := e.p.Alloc(ctx, memBytes(size), nil)
					require.NoError(t, err)
					got = append(got, g)
				}
			})
		})
		watchdog.Within(t, 10*time.Second, "Stats after the panic", func() {
			st := e.p.Stats()
			require.Equal(t, memBytes(2*size), st.Pending, "b and c pending, once each")
		})
		watchdog.Within(t, 10*time.Second, "Trim after the panic", func() {
			_, err := e.p.Trim(ctx) // c: Done #3, cached
			require.NoError(t, err)
		})
		require.Equal(t, memBytes(size), e.checkLedger(t).Pending)
		fb.done.Store(true)
		_, err = e.p.Trim(ctx)
		require.NoError(t, err)
		st := e.checkLedger(t)
		require.Zero(t, st.Pending)
		require.Zero(t, st.InUse)
		watchdog.Within(t, 10*time.Second, "Close after the panic", func() { require.NoError(t, e.p.Close()) })
		e.drain(t)
		require.Zero(t, e.m.UsedBytes())
		require.NoError(t, s.Close())
	}
}

func memBytes(n uint64) memapi.Bytes { return memapi.Bytes(n) }
