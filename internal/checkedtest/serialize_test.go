package checkedtest

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// gatedCommit is the test mechanism with a Commit that waits at a gate, so a
// test can hold one mutating call inside the mechanism.
type gatedCommit struct {
	*mech
	entered, release chan struct{}
}

func (g *gatedCommit) AsVirtualBacking() (memapi.VirtualBacking, bool) { return g, true }

func (g *gatedCommit) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	close(g.entered)
	<-g.release
	return g.mech.Commit(ctx, res, r, grant)
}

// TestVerifySerializesMutatingCalls: in verify mode a mutating call waits
// while another is inside the mechanism, so the figures read around each
// call see only its own effect; outside verify mode calls run concurrently.
// Dropping the verify-mode lock lets the Allocate through and fails this.
func TestVerifySerializesMutatingCalls(t *testing.T) {
	for _, verify := range []bool{false, true} {
		inner := &gatedCommit{mech: newMech(auth, 0), entered: make(chan struct{}), release: make(chan struct{})}
		m := wrapWith(inner, doubles, verify)
		vb, err := memapi.RequireVirtualBacking(m)
		require.NoError(t, err)
		res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
		require.NoError(t, err)
		g := newGrant(auth, 0)
		committed := make(chan error, 1)
		go func() { committed <- vb.Commit(ctx, res, rng(0, testGran), g) }()
		<-inner.entered
		allocated := make(chan error, 1)
		go func() {
			_, err := m.Allocate(ctx, memapi.AllocRequest{Size: 1}, g)
			allocated <- err
		}()
		if !verify {
			require.NoError(t, <-allocated, "outside verify mode the Allocate runs beside the Commit")
		} else {
			select {
			case <-allocated:
				t.Fatal("verify mode let an Allocate run while a Commit was inside the mechanism")
			case <-time.After(200 * time.Millisecond):
			}
		}
		close(inner.release)
		require.NoError(t, <-committed)
		if verify {
			require.NoError(t, <-allocated, "the waiting Allocate runs once the Commit returned")
		}
		require.True(t, checked.Verifying(m) == verify)
	}
}
