package checkedtest

import (
	"context"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/stretchr/testify/require"
)

// forged is a grant and account made by hand: the right methods, the right
// authority, and a Draw that always succeeds. Before the wrapper checked a
// grant's issuer, a value like this drew from nothing: memory was installed
// that no ledger had granted.
type forged struct {
	authority memapi.AuthorityID
	calls     int
}

func (f *forged) Authority() memapi.AuthorityID { f.calls++; return f.authority }
func (f *forged) Draw(memapi.Bytes) error       { f.calls++; return nil }
func (f *forged) Undraw(memapi.Bytes) error     { f.calls++; return nil }
func (f *forged) Refund(memapi.Bytes) error     { f.calls++; return nil }

// newGovernor returns a governor with authority auth (and "other") of 1 GiB
// and a registered holder "h".
func newGovernor(t *testing.T) *governor.Governor {
	t.Helper()
	g := governor.New(governor.Options{})
	require.NoError(t, g.AddAuthority(auth, 1<<30))
	require.NoError(t, g.AddAuthority("other", 1<<30))
	require.NoError(t, g.Register("h", nil, governor.HolderOptions{}))
	t.Cleanup(func() { _ = g.Close() })
	return g
}

func reserve(t *testing.T, g *governor.Governor, a memapi.AuthorityID, n memapi.Bytes) governor.Grant {
	t.Helper()
	gr, err := g.Reserve(context.Background(), governor.Request{Authority: a, Holder: "h", Role: "r", Bytes: n})
	require.NoError(t, err)
	return gr
}

// consumingCalls makes each consuming call of the contract with grant gr on
// fresh handles, returning the call's error; setup is made with the rig's own
// trusted grant.
func consumingCalls(r *rig) map[string]func(gr memapi.Grant) error {
	return map[string]func(gr memapi.Grant) error{
		"Allocate": func(gr memapi.Grant) error {
			_, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, gr)
			return err
		},
		"Commit": func(gr memapi.Grant) error {
			res := r.reserve(4 * testGran)
			return r.vb.Commit(ctx, res, rng(0, testGran), gr)
		},
		"CreateBacking": func(gr memapi.Grant) error {
			_, err := r.sm.CreateBacking(ctx, testGran, gr)
			return err
		},
		"CopyOnWrite": func(gr memapi.Grant) error {
			res := r.reserve(4 * testGran)
			v := r.view(res, 0, r.backing(testGran), memapi.AccessReadOnly)
			_, err := r.sm.CopyOnWrite(ctx, v, gr)
			return err
		},
	}
}

// refundingCalls makes each refunding call with account to on a fresh handle
// and returns the call's error and whether the handle is still live.
func refundingCalls(r *rig) map[string]func(to memapi.Account) (error, bool) {
	return map[string]func(to memapi.Account) (error, bool){
		"Free": func(to memapi.Account) (error, bool) {
			a := r.alloc(1)
			return r.m.Free(ctx, a, to), a.Live()
		},
		"Decommit": func(to memapi.Account) (error, bool) {
			res := r.reserve(4 * testGran)
			r.commit(res, 0, testGran)
			err := r.vb.Decommit(ctx, res, rng(0, testGran), to)
			n, _ := r.vb.CommittedBytes(res)
			return err, n == testGran
		},
		"ReleaseReservation": func(to memapi.Account) (error, bool) {
			res := r.reserve(4 * testGran)
			r.commit(res, 0, testGran)
			return r.vb.ReleaseReservation(ctx, res, to), res.Live()
		},
		"ReleaseBacking": func(to memapi.Account) (error, bool) {
			b := r.backing(testGran)
			return r.sm.ReleaseBacking(ctx, b, to), b.Live()
		},
	}
}

// TestForgedGrantRejected: a hand-made grant is refused with ErrForeignGrant
// by every consuming call; neither the mechanism nor the forgery is called.
func TestForgedGrantRejected(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		for name, call := range consumingCalls(r) {
			t.Run(name, func(t *testing.T) {
				f := &forged{authority: auth}
				n := r.inner.count(methodOf(name))
				me := requireKind(t, call(f), memapi.ErrForeignGrant, "")
				require.Contains(t, me.Detail, "*checkedtest.forged")
				require.Zero(t, f.calls, "the forgery's methods are not even asked")
				require.Equal(t, n, r.inner.count(methodOf(name)), "the mechanism is not called")
			})
		}
	})
}

// TestForgedAccountRejected: a hand-made account is refused with
// ErrForeignGrant by every refunding call, and the handle stays live.
func TestForgedAccountRejected(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newRig(t, verify)
		for name, call := range refundingCalls(r) {
			t.Run(name, func(t *testing.T) {
				f := &forged{authority: auth}
				n := r.inner.count(methodOf(name))
				err, live := call(f)
				requireKind(t, err, memapi.ErrForeignGrant, "")
				require.True(t, live, "the handle is not released")
				require.Zero(t, f.calls)
				require.Equal(t, n, r.inner.count(methodOf(name)), "the mechanism is not called")
			})
		}
	})
}

// TestGrantOfAnotherGovernorRejected: a wrapper built with one governor
// refuses a real grant of another governor (same authority name, same
// holder), and that governor's figures do not move; its own governor's grant
// is drawn from.
func TestGrantOfAnotherGovernorRejected(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		mine, theirs := newGovernor(t), newGovernor(t)
		inner := newMech(auth, 0)
		var opts []checked.Option
		if verify {
			opts = append(opts, checked.WithVerify())
		}
		m := checked.Wrap(inner, mine.Ledger(), opts...)
		vb, err := memapi.RequireVirtualBacking(m)
		require.NoError(t, err)

		foreign := reserve(t, theirs, auth, 1<<20)
		_, err = m.Allocate(ctx, memapi.AllocRequest{Size: 1}, foreign)
		requireKind(t, err, memapi.ErrForeignGrant, "DeviceAllocator.Allocate")
		res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
		require.NoError(t, err)
		requireKind(t, vb.Commit(ctx, res, rng(0, testGran), foreign), memapi.ErrForeignGrant, "VirtualBacking.Commit")
		require.Zero(t, drawn(t, theirs, auth))
		require.Zero(t, inner.count(mAllocate)+inner.count(mCommit))
		require.Zero(t, inner.UsedBytes())

		// The wrapper's own governor: accepted, drawn, and its lease is an
		// account the wrapper refunds to; the other governor's lease is not.
		own := reserve(t, mine, auth, 1<<20)
		a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 1}, own)
		require.NoError(t, err)
		require.EqualValues(t, testAllocGran, drawn(t, mine, auth))
		lease, err := own.Commit()
		require.NoError(t, err)

		fg := reserve(t, theirs, auth, testAllocGran)
		require.NoError(t, fg.Draw(testAllocGran))
		theirLease, err := fg.Commit()
		require.NoError(t, err)
		requireKind(t, m.Free(ctx, a, theirLease), memapi.ErrForeignGrant, "DeviceAllocator.Free")
		requireKind(t, m.Free(ctx, a, foreign), memapi.ErrForeignGrant, "DeviceAllocator.Free")
		require.True(t, a.Live())
		require.EqualValues(t, testAllocGran, theirLease.Bytes(), "the other governor's lease is not refunded")

		require.NoError(t, m.Free(ctx, a, lease))
		require.Zero(t, lease.Bytes())
		s, _ := mine.Authority(auth)
		require.Zero(t, s.Charged)
	})
}

// TestAccountOfAnotherAuthorityRejected: a lease of the wrapper's own
// governor on another authority is refused with ErrAuthorityMismatch (it is
// genuine, but not this mechanism's pool); one of another governor on the
// same authority name with ErrForeignGrant. Neither is refunded.
func TestAccountOfAnotherAuthorityRejected(t *testing.T) {
	mine, theirs := newGovernor(t), newGovernor(t)
	inner := newMech(auth, 0)
	m := checked.Wrap(inner, mine.Ledger())
	own := reserve(t, mine, auth, 1<<20)
	a, err := m.Allocate(ctx, memapi.AllocRequest{Size: 1}, own)
	require.NoError(t, err)

	lease := func(g *governor.Governor, at memapi.AuthorityID) governor.Lease {
		gr := reserve(t, g, at, testAllocGran)
		require.NoError(t, gr.Draw(testAllocGran))
		l, err := gr.Commit()
		require.NoError(t, err)
		return l
	}
	otherAuth := lease(mine, "other")
	requireKind(t, m.Free(ctx, a, otherAuth), memapi.ErrAuthorityMismatch, "DeviceAllocator.Free")
	otherGov := lease(theirs, auth)
	requireKind(t, m.Free(ctx, a, otherGov), memapi.ErrForeignGrant, "DeviceAllocator.Free")
	require.True(t, a.Live())
	require.Zero(t, inner.count(mFree))
	require.EqualValues(t, testAllocGran, otherAuth.Bytes())
	require.EqualValues(t, testAllocGran, otherGov.Bytes())

	// A grant of the right governor and the wrong authority, likewise.
	_, err = m.Allocate(ctx, memapi.AllocRequest{Size: 1}, reserve(t, mine, "other", 1<<20))
	requireKind(t, err, memapi.ErrAuthorityMismatch, "DeviceAllocator.Allocate")
	require.NoError(t, m.Free(ctx, a, own))
}

// TestRewrapDoesNotWidenTrust: a wrapper handed out with NoLedger (or any
// ledger) cannot be turned into one that accepts more by wrapping it again:
// the rewrap accepts only what both ledgers vouch for.
func TestRewrapDoesNotWidenTrust(t *testing.T) {
	inner := newMech(auth, 0)
	public := checked.Wrap(inner, checked.NoLedger)
	_, err := public.Allocate(ctx, memapi.AllocRequest{Size: 1}, newGrant(auth, 0))
	requireKind(t, err, memapi.ErrForeignGrant, "DeviceAllocator.Allocate")

	rewrapped := checked.Wrap(public, doubles, checked.WithVerify())
	_, err = rewrapped.Allocate(ctx, memapi.AllocRequest{Size: 1}, newGrant(auth, 0))
	requireKind(t, err, memapi.ErrForeignGrant, "DeviceAllocator.Allocate")
	require.Zero(t, inner.count(mAllocate))

	// Ledgers widens only by the caller's choice, at the first wrap.
	both := checked.Wrap(inner, checked.Ledgers(checked.NoLedger, doubles))
	_, err = both.Allocate(ctx, memapi.AllocRequest{Size: 1}, newGrant(auth, 0))
	require.NoError(t, err)
}

// methodOf maps a call name of the tables above to the mechanism's counter.
func methodOf(name string) method {
	for k, n := range methodNames {
		if n == name {
			return method(k)
		}
	}
	panic("no method " + name)
}

// drawn is what is drawn from g's open grants on authority id now.
func drawn(t *testing.T, g *governor.Governor, id memapi.AuthorityID) memapi.Bytes {
	t.Helper()
	s, ok := g.Authority(id)
	require.True(t, ok, "authority %s", id)
	return s.Drawn
}
