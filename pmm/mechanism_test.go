package pmm_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

// TestNothingPublicYieldsRawMechanism: what Manager.Mechanism hands out (the
// only value of pmm's API that is a mechanism) is neither the raw mechanism
// nor a way to it. checked.Unwrap, which used to return the raw mechanism
// from any wrapper, no longer exists; its capability values are not the raw
// mechanism's; it takes no grant, not even a genuine one of the manager's own
// governor, nor a forged one; and wrapping it again, with any ledger, gives
// no more. Before and after Replace.
func TestNothingPublicYieldsRawMechanism(t *testing.T) {
	ctx := context.Background()
	g := governor.New(governor.Options{})
	t.Cleanup(func() { _ = g.Close() })
	require.NoError(t, g.AddAuthority(auth, 1<<30))
	require.NoError(t, g.Register("h", nil, governor.HolderOptions{}))
	raw := fakes.NewMechanism(fakes.Config{Authority: auth})
	ectx := ep.NewContext(fakes.NewContext(raw), ep.Options{})
	t.Cleanup(func() {
		watchdog.Within(t, watchdog.Bound, "the device context's Close", func() { require.NoError(t, ectx.Close(ctx, true)) })
	})
	mgr := pmm.New(g, pmm.Options{})
	require.NoError(t, mgr.Register(pmm.Device{Key: dev0, Mechanism: raw, Context: ectx, Authority: auth}))

	check := func(t *testing.T, raw *fakes.Mechanism) {
		m, err := mgr.Mechanism(dev0)
		require.NoError(t, err)
		require.NotEqual(t, reflect.TypeOf(raw), reflect.TypeOf(m), "the raw mechanism itself")
		require.Equal(t, raw.Info(), m.Info(), "it still describes the mechanism")
		require.Equal(t, memapi.Negotiate(raw), memapi.Negotiate(m))
		rvb, _ := raw.AsVirtualBacking()
		vb, ok := m.AsVirtualBacking()
		require.True(t, ok)
		require.NotEqual(t, reflect.TypeOf(rvb), reflect.TypeOf(vb), "the raw VirtualBacking")
		rsm, _ := raw.AsSharedMapping()
		sm, ok := m.AsSharedMapping()
		require.True(t, ok)
		require.NotEqual(t, reflect.TypeOf(rsm), reflect.TypeOf(sm), "the raw SharedMapping")

		gr, err := g.Reserve(ctx, governor.Request{Authority: auth, Holder: "h", Role: "r", Bytes: 1 << 20})
		require.NoError(t, err)
		defer func() { require.NoError(t, gr.Cancel()) }()
		for name, mech := range map[string]memapi.Mechanism{
			"handed out":                m,
			"rewrapped with fakes":      checked.Wrap(m, fakes.Ledger),
			"rewrapped with the ledger": checked.Wrap(m, g.Ledger(), checked.WithVerify()),
		} {
			_, err := mech.Allocate(ctx, memapi.AllocRequest{Size: 1}, gr)
			require.ErrorIs(t, err, memapi.ErrForeignGrant, "%s: a genuine grant of the manager's governor", name)
			_, err = mech.Allocate(ctx, memapi.AllocRequest{Size: 1}, fakes.NewGrant(auth, 1<<20))
			require.ErrorIs(t, err, memapi.ErrForeignGrant, "%s: a fake grant", name)
			v, _ := mech.AsVirtualBacking()
			res, err := v.Reserve(ctx, memapi.ReserveRequest{Size: 1 << 20})
			require.NoError(t, err, "%s: address space needs no grant", name)
			require.ErrorIs(t, v.Commit(ctx, res, memapi.Range{Len: res.Size()}, gr), memapi.ErrForeignGrant, name)
			require.ErrorIs(t, v.ReleaseReservation(ctx, res, gr), memapi.ErrForeignGrant, "%s: refunds need a trusted account too", name)
			require.True(t, res.Live())
			rv, _ := raw.AsVirtualBacking()
			require.NoError(t, rv.ReleaseReservation(ctx, res, gr), "cleanup through the raw mechanism, which refunds nothing")
		}
		require.Zero(t, raw.AllocateCallCount())
		require.Zero(t, raw.CommitCallCount())
		s, _ := g.Authority(auth)
		require.Zero(t, s.Drawn, "nothing drawn from the grant")

		// The manager's own path still works and draws from its governor.
		b, err := mgr.Bind("h", "r", dev0)
		require.NoError(t, err)
		buf, err := b.Allocate(ctx, 1)
		require.NoError(t, err)
		require.Equal(t, 1, raw.AllocateCallCount())
		require.NoError(t, buf.Close())
		require.NoError(t, ectx.Queue().Drain(ctx))
		s, _ = g.Authority(auth)
		require.Zero(t, s.Charged+s.Pending)
	}
	t.Run("registered", func(t *testing.T) { check(t, raw) })
	raw2 := fakes.NewMechanism(fakes.Config{Authority: auth})
	require.NoError(t, mgr.Replace(dev0, raw2))
	t.Run("replaced", func(t *testing.T) { check(t, raw2) })
}
