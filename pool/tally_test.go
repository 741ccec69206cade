package pool_test

import (
	"context"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestPeaksExactUnderConcurrency: goroutines, each on whatever shard its P
// gives it, allocate small blocks until all of them hold theirs at once
// (a barrier), then free them and do it again at a lower level. The true
// peak is every goroutine's blocks together, whatever the shards' shares:
// PeakInUse and PeakRequested must equal it exactly, though no Alloc on
// the fast path writes outside its shard. Lower levels afterwards, and
// free-on-another-goroutine, never raise it.
func TestPeaksExactUnderConcurrency(t *testing.T) {
	e := setup(t, 1<<30, pool.Options{})
	ctx := context.Background()
	const workers, each, size, asked = 6, 40, 4096, 4000
	held := make([][]pool.Block, workers)
	round := func(k int) {
		var wg sync.WaitGroup
		ready := make(chan struct{})
		var all sync.WaitGroup
		all.Add(workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range k {
					b, err := e.p.Alloc(ctx, asked, nil)
					if err != nil {
						t.Error(err)
						break
					}
					held[w] = append(held[w], b)
				}
				all.Done()
				<-ready // everyone holds theirs now
			}()
		}
		all.Wait()
		s := e.p.Stats()
		require.Equal(t, memapi.Bytes(workers*k*size), s.InUse)
		require.Equal(t, memapi.Bytes(workers*k*asked), s.Requested)
		close(ready)
		watchdog.Within(t, watchdog.Bound, "the frees", wg.Wait)
		// Free each goroutine's blocks on another goroutine than the one
		// that took them: the shares go negative on some shards.
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, b := range held[(w+1)%workers] {
					if err := b.Free(); err != nil {
						t.Error(err)
					}
				}
			}()
		}
		watchdog.Within(t, watchdog.Bound, "the cross frees", wg.Wait)
		clear(held)
	}
	round(each)
	s := e.p.Stats()
	require.Equal(t, memapi.Bytes(workers*each*size), s.PeakInUse)
	require.Equal(t, memapi.Bytes(workers*each*asked), s.PeakRequested)
	require.Zero(t, s.InUse)
	require.Zero(t, s.Requested)
	for range 3 {
		round(each / 2)
	}
	s = e.p.Stats()
	require.Equal(t, memapi.Bytes(workers*each*size), s.PeakInUse, "a lower level left the peak alone")
	require.Equal(t, memapi.Bytes(workers*each*asked), s.PeakRequested)
	require.NotZero(t, s.PeakSyncs)
}
