package pmm_test

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

// Register refuses a device whose authority the governor does not have,
// and Bind one whose authority was removed since, with a typed error, not
// at the first Allocate.
func TestRegisterAndBindRefuseAnAuthorityTheGovernorLacks(t *testing.T) {
	g := governor.New(governor.Options{})
	t.Cleanup(func() { g.Close() })
	require.NoError(t, g.AddAuthority("gpu", 1<<20))
	m := fakes.NewMechanism(fakes.Config{Authority: "host"}) // the governor has "gpu" only
	ectx := ep.NewContext(fakes.NewContext(m), ep.Options{})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, ectx.Close(ctx, true))
	})
	mgr := pmm.New(g, pmm.Options{})
	err := mgr.Register(pmm.Device{Key: dev0, Mechanism: m, Context: ectx, Authority: "host"})
	require.ErrorIs(t, err, governor.ErrUnknown)
	var me *memapi.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, memapi.AuthorityID("host"), me.Authority)
	require.Contains(t, err.Error(), `"host"`)
	_, err = mgr.Bind("kv", "cache", dev0)
	require.ErrorIs(t, err, memapi.ErrInvalidRange, "nothing was registered")

	require.NoError(t, g.AddAuthority("host", 1<<20))
	require.NoError(t, mgr.Register(pmm.Device{Key: dev0, Mechanism: m, Context: ectx, Authority: "host"}))
	b, err := mgr.Bind("kv", "cache", dev0)
	require.NoError(t, err)
	require.NoError(t, b.Close())

	require.NoError(t, g.RemoveAuthority("host"))
	_, err = mgr.Bind("kv", "cache", dev0)
	require.ErrorIs(t, err, governor.ErrUnknown)
	require.NoError(t, mgr.Close(context.Background()))
}
