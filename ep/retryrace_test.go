package ep_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/stretchr/testify/require"
)

// TestRetryRacingAFailedReleaseLeavesNoStaleQuarantine: a retry that
// lands as soon as a failed release marked its handle quarantined (here
// from another goroutine, as a pool's Trim retries its segments while the
// queue reports a failure) must not leave the handle counted quarantined
// once it is released. The context's count (Quarantined, which
// Manager.Close and Context.Close read) used to be updated after the
// handle's state, outside its lock, so a retry in between was undone: the
// released handle stayed counted, forever.
func TestRetryRacingAFailedReleaseLeavesNoStaleQuarantine(t *testing.T) {
	c, _ := newCtx(t)
	for i := range 2000 {
		var frees atomic.Int32
		o, err := c.Own("buf", &releaser{free: func(context.Context) error {
			if frees.Add(1)%2 == 1 {
				return errors.New("injected")
			}
			return nil
		}})
		require.NoError(t, err)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = o.Close() }()
		go func() {
			defer wg.Done()
			for o.State() != ep.Released {
				_ = o.Lifecycle().Retry()
			}
		}()
		wg.Wait()
		drain(t, c)
		require.Equal(t, ep.Released, o.State())
		require.Zero(t, c.Quarantined(), "round %d: a released handle is still counted quarantined", i)
	}
}
