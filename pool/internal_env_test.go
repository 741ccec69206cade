package pool

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

// newTestPool is a pool with default options over a fake mechanism with
// 1 GiB of capacity, registered as a cache holder, for the package's
// internal tests (the external ones use setup, helpers_test.go). The
// test's cleanup closes it and checks that everything closes cleanly.
func newTestPool(t *testing.T) *Pool {
	t.Helper()
	const a = memapi.AuthorityID("dev")
	m := fakes.NewMechanism(fakes.Config{Authority: a, Offers: memapi.Of(memapi.CapDeviceAllocator)})
	ectx := ep.NewContext(fakes.NewContext(m), ep.Options{})
	g := governor.New(governor.Options{})
	require.NoError(t, g.AddAuthority(a, 1<<30))
	mgr := pmm.New(g, pmm.Options{})
	dev := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	require.NoError(t, mgr.Register(pmm.Device{Key: dev, Mechanism: m, Context: ectx, Authority: a}))
	b, err := mgr.Bind("pool", "workspace", dev)
	require.NoError(t, err)
	p, err := New(b, Options{})
	require.NoError(t, err)
	require.NoError(t, g.Register("pool", p, governor.HolderOptions{Cache: true}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, p.Close())
		require.NoError(t, mgr.Close(ctx))
		require.NoError(t, ectx.Close(ctx, true))
		require.NoError(t, g.Close())
	})
	return p
}
