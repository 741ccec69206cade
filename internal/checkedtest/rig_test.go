package checkedtest

import (
	"context"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

const auth memapi.AuthorityID = "test"

var ctx = context.Background()

// rig is one wrapped mechanism with its ledger doubles.
type rig struct {
	t     *testing.T
	inner *mech
	m     memapi.Mechanism // the checked wrapper
	vb    memapi.VirtualBacking
	sm    memapi.SharedMapping
	g     *grant
	acct  *account
}

func newRig(t *testing.T, verify bool) *rig {
	t.Helper()
	return newRigOver(t, newMech(auth, 0), verify)
}

func newRigOver(t *testing.T, inner *mech, verify bool) *rig {
	t.Helper()
	var opts []checked.Option
	if verify {
		opts = append(opts, checked.WithVerify())
	}
	m := checked.Wrap(inner, doubles, opts...)
	vb, err := memapi.RequireVirtualBacking(m)
	require.NoError(t, err)
	sm, err := memapi.RequireSharedMapping(m)
	require.NoError(t, err)
	return &rig{t: t, inner: inner, m: m, vb: vb, sm: sm, g: newGrant(auth, 0), acct: newAccount(auth)}
}

// modes runs f once without and once with verify mode.
func modes(t *testing.T, f func(t *testing.T, verify bool)) {
	for _, verify := range []bool{false, true} {
		name := "plain"
		if verify {
			name = "verify"
		}
		t.Run(name, func(t *testing.T) { f(t, verify) })
	}
}

// snapshot is everything a rejected call must leave as it was.
type snapshot struct {
	calls    int64 // calls into the inner mechanism
	used     memapi.Bytes
	drawn    memapi.Bytes
	draws    int
	undraws  int
	refunded memapi.Bytes
	refunds  int
}

func (r *rig) snap() snapshot {
	s := snapshot{calls: r.inner.totalCalls(), used: r.inner.UsedBytes()}
	s.drawn, s.draws, s.undraws = r.g.state()
	s.refunded, s.refunds = r.acct.state()
	return s
}

func (r *rig) alloc(size memapi.Bytes) *memapi.Allocation {
	r.t.Helper()
	a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: size}, r.g)
	require.NoError(r.t, err)
	return a
}

func (r *rig) reserve(size memapi.Bytes) *memapi.Reservation {
	r.t.Helper()
	res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: size})
	require.NoError(r.t, err)
	return res
}

func (r *rig) commit(res *memapi.Reservation, off, n memapi.Bytes) {
	r.t.Helper()
	require.NoError(r.t, r.vb.Commit(ctx, res, memapi.Range{Off: off, Len: n}, r.g))
}

func (r *rig) backing(size memapi.Bytes) *memapi.Backing {
	r.t.Helper()
	b, err := r.sm.CreateBacking(ctx, size, r.g)
	require.NoError(r.t, err)
	return b
}

func (r *rig) view(res *memapi.Reservation, off memapi.Bytes, b *memapi.Backing, acc memapi.Access) *memapi.View {
	r.t.Helper()
	v, err := r.sm.MapView(ctx, res, memapi.Range{Off: off, Len: b.Size()}, b, acc)
	require.NoError(r.t, err)
	return v
}

// requireKind checks that err is an *memapi.Error of the given kind, for op.
func requireKind(t *testing.T, err error, kind error, op string) *memapi.Error {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, kind)
	var me *memapi.Error
	require.ErrorAs(t, err, &me)
	require.Equal(t, kind, me.Kind, "kind of %v", err)
	if op != "" {
		require.Equal(t, op, me.Op)
	}
	return me
}
