package pool_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// countFence counts its Done calls; it is done once set.
type countFence struct {
	done  atomic.Bool
	polls atomic.Int64
}

func (f *countFence) Done() bool                 { f.polls.Add(1); return f.done.Load() }
func (f *countFence) Wait(context.Context) error { return nil }
func (f *countFence) Ready() <-chan struct{}     { return nil }

// TestStaleFreeNeverTouchesNextOwner: a handle whose block was freed and
// handed out again is stale. Its Free is ErrDoubleFree and reads nothing of
// the block's next owner: it polls none of the fences the next owner
// recorded, and the next owner's Free goes on as if it never happened.
func TestStaleFreeNeverTouchesNextOwner(t *testing.T) {
	for _, size := range []memapi.Bytes{4096, 4 << 20} {
		e := setup(t, 1<<30, pool.Options{})
		ctx := context.Background()
		old, err := e.p.Alloc(ctx, size, nil)
		require.NoError(t, err)
		require.NoError(t, old.Free())
		next, err := e.p.Alloc(ctx, size, nil)
		require.NoError(t, err)
		if size <= pool.SmallMax {
			require.Equal(t, old.Addr(), next.Addr(), "the same block, handed out again")
		}
		f := &countFence{}
		require.NoError(t, next.RecordStreamUse(f))
		require.ErrorIs(t, old.Free(), pool.ErrDoubleFree)
		require.Zero(t, f.polls.Load(), "the stale Free polled the next owner's fence")
		require.NoError(t, next.RecordUse(f), "the next owner's block is still open")
		f.done.Store(true)
		require.NoError(t, next.Free())
		e.checkLedger(t)
	}
}

// TestRacingFreesToldApart: two Frees of one block race (blocks freed behind
// fences that have not completed, and blocks with none). Exactly one wins;
// the other is ErrDoubleFree. Neither crashes, and the pool's figures count
// one free.
func TestRacingFreesToldApart(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	ctx := context.Background()
	s := e.stream(t)
	for i := range 400 {
		size := memapi.Bytes(4096)
		if i%4 == 3 {
			size = 3 << 20
		}
		b, err := e.p.Alloc(ctx, size, s)
		require.NoError(t, err)
		fs := make([]*countFence, 1+i%3)
		for k := range fs {
			fs[k] = &countFence{}
			fs[k].done.Store(i%2 == 0)
			require.NoError(t, b.RecordUse(fs[k]))
		}
		var start, wg sync.WaitGroup
		start.Add(1)
		errs := make([]error, 2)
		for k := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start.Wait()
				errs[k] = b.Free()
			}()
		}
		start.Done()
		watchdog.Within(t, 10*time.Second, "racing Frees", wg.Wait)
		require.True(t, (errs[0] == nil) != (errs[1] == nil), "one Free wins: %v, %v", errs[0], errs[1])
		for _, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, pool.ErrDoubleFree)
			}
		}
		for _, f := range fs {
			f.done.Store(true)
		}
	}
	st := e.p.Stats()
	require.Equal(t, st.Allocs, st.Frees)
	require.Zero(t, st.InUse)
	e.checkLedger(t)
}
