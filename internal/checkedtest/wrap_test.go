package checkedtest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// TestNegotiationThroughTheWrapper: the wrapper offers exactly what the
// mechanism offers, for every subset of the optional capabilities, and what
// it hands out is its own checked capability.
func TestNegotiationThroughTheWrapper(t *testing.T) {
	da := memapi.Of(memapi.CapDeviceAllocator)
	for _, offers := range []memapi.CapSet{
		da,
		da | memapi.Of(memapi.CapVirtualBacking),
		da | memapi.Of(memapi.CapSharedMapping),
		memapi.Of(memapi.Capabilities...),
	} {
		t.Run(offers.String(), func(t *testing.T) {
			inner := newMech(auth, offers)
			m := checked.Wrap(inner, doubles)
			require.Equal(t, memapi.Negotiate(inner), memapi.Negotiate(m))
			require.Equal(t, offers, memapi.Negotiate(m))

			vb, ok := m.AsVirtualBacking()
			require.Equal(t, offers.Has(memapi.CapVirtualBacking), ok)
			sm, ok2 := m.AsSharedMapping()
			require.Equal(t, offers.Has(memapi.CapSharedMapping), ok2)
			if ok {
				require.NotSame(t, inner, vb, "the capability must be the checked one")
				_, err := vb.Reserve(ctx, memapi.ReserveRequest{})
				requireKind(t, err, memapi.ErrInvalidSize, opReserve)
				require.Zero(t, inner.count(mReserve))
			} else {
				require.Nil(t, vb)
				_, err := memapi.RequireVirtualBacking(m)
				require.ErrorIs(t, err, memapi.ErrUnsupported)
			}
			if ok2 {
				_, err := sm.CreateBacking(ctx, 0, newGrant(auth, 0))
				requireKind(t, err, memapi.ErrInvalidSize, opCreateBacking)
				require.Zero(t, inner.count(mCreateBacking))
			} else {
				require.Nil(t, sm)
			}
		})
	}
}

// TestNegotiationFollowsTheMechanismNow: the accessor asks the mechanism on
// every call (no-stale-capability), so a capability that goes away is gone
// through the wrapper too.
func TestNegotiationFollowsTheMechanismNow(t *testing.T) {
	inner := newMech(auth, 0)
	m := checked.Wrap(inner, doubles)
	_, ok := m.AsVirtualBacking()
	require.True(t, ok)
	inner.offers = memapi.Of(memapi.CapDeviceAllocator)
	_, ok = m.AsVirtualBacking()
	require.False(t, ok)
	require.Equal(t, memapi.Of(memapi.CapDeviceAllocator), memapi.Negotiate(m))
}

// claimsNil claims VirtualBacking but hands out nil: a capability claimed but
// unsupported. The wrapper reports it absent, as RequireVirtualBacking does,
// rather than a capability that would fail on every call.
type claimsNil struct{ *mech }

func (claimsNil) AsVirtualBacking() (memapi.VirtualBacking, bool) { return nil, true }

func TestClaimedButNilCapabilityIsAbsent(t *testing.T) {
	m := checked.Wrap(claimsNil{newMech(auth, 0)}, doubles)
	vb, ok := m.AsVirtualBacking()
	require.False(t, ok)
	require.Nil(t, vb)
	_, err := memapi.RequireVirtualBacking(m)
	require.ErrorIs(t, err, memapi.ErrUnsupported)
}

// TestAccessorIsCached: asking again hands out the same checked capability,
// without allocating.
func TestAccessorIsCached(t *testing.T) {
	m := checked.Wrap(newMech(auth, 0), doubles)
	a, _ := m.AsVirtualBacking()
	b, _ := m.AsVirtualBacking()
	require.Same(t, a, b)
	allocs := testing.AllocsPerRun(100, func() { _, _ = m.AsSharedMapping() })
	require.Zero(t, allocs)
}

// incomparable is a mechanism value of a type that cannot be compared: the
// accessor cache must not panic on it.
type incomparable struct {
	*mech
	_ []int
}

func (m incomparable) AsVirtualBacking() (memapi.VirtualBacking, bool) { return m, true }

func TestAccessorSurvivesIncomparableCapabilities(t *testing.T) {
	m := checked.Wrap(incomparable{mech: newMech(auth, 0)}, doubles)
	for range 2 {
		vb, ok := m.AsVirtualBacking()
		require.True(t, ok)
		require.NotNil(t, vb)
	}
}

func TestInfoIsTheMechanismsInfo(t *testing.T) {
	inner := newMech(auth, 0)
	m := checked.Wrap(inner, doubles, checked.WithVerify())
	require.Equal(t, inner.Info(), m.Info())
	require.Equal(t, inner.iss.Instance(), m.Info().Instance)
}

// TestWrapTwiceChecksOnce: wrapping a wrapper must not draw twice.
func TestWrapTwiceChecksOnce(t *testing.T) {
	inner := newMech(auth, 0)
	m := checked.Wrap(checked.Wrap(inner, doubles), doubles)
	g := newGrant(auth, 0)
	_, err := m.Allocate(ctx, memapi.AllocRequest{Size: 1}, g)
	require.NoError(t, err)
	drawn, draws, _ := g.state()
	require.EqualValues(t, testAllocGran, drawn)
	require.Equal(t, 1, draws)
	require.EqualValues(t, 1, inner.count(mAllocate), "the rewrap calls the mechanism itself, once")

	require.True(t, checked.Verifying(checked.Wrap(checked.Wrap(inner, doubles, checked.WithVerify()), doubles)), "options are kept")
	require.True(t, checked.Verifying(checked.Wrap(checked.Wrap(inner, doubles), doubles, checked.WithVerify())), "options are added")
}

func TestWrapNilPanics(t *testing.T) {
	require.PanicsWithValue(t, "checked: Wrap of a nil Mechanism", func() { checked.Wrap(nil, doubles) })
	require.PanicsWithValue(t, "checked: Wrap without a Ledger (use NoLedger for a wrapper that takes no grant)",
		func() { checked.Wrap(newMech(auth, 0), nil) })
}

// TestConcurrentUse hammers one wrapper from many goroutines under -race;
// at the end the ledger balances against the mechanism's own counter.
func TestConcurrentUse(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		const workers, rounds = 8, 50
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- work(r, w, rounds)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		drawn, _, _ := r.g.state()
		refunded, _ := r.acct.state()
		require.Equal(t, drawn, refunded)
		require.Zero(t, r.inner.UsedBytes())
	})
}

func work(r *rig, w, rounds int) error {
	for i := range rounds {
		a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: memapi.Bytes(1 + w*i)}, r.g)
		if err != nil {
			return err
		}
		res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 2 * testGran})
		if err != nil {
			return err
		}
		if err := r.vb.Commit(ctx, res, rng(0, testGran), r.g); err != nil {
			return err
		}
		b, err := r.sm.CreateBacking(ctx, testGran, r.g)
		if err != nil {
			return err
		}
		v, err := r.sm.MapView(ctx, res, rng(testGran, testGran), b, memapi.AccessReadOnly)
		if err != nil {
			return err
		}
		if v, err = r.sm.CopyOnWrite(ctx, v, r.g); err != nil {
			return err
		}
		if err := r.sm.UnmapView(ctx, v); err != nil {
			return err
		}
		for _, b := range []*memapi.Backing{v.Backing(), b} {
			if err := r.sm.ReleaseBacking(ctx, b, r.acct); err != nil {
				return err
			}
		}
		if err := r.vb.ReleaseReservation(ctx, res, r.acct); err != nil {
			return err
		}
		if err := r.m.Free(ctx, a, r.acct); err != nil {
			return err
		}
		// Every handle of this round is released: using any is an error.
		if err := r.m.Free(ctx, a, r.acct); err == nil {
			return fmt.Errorf("double free of %v accepted", a)
		}
	}
	return nil
}
