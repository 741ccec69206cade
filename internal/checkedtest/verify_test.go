package checkedtest

import (
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// The meta-tests: deliberately broken mechanisms, each caught by the wrapper
// check meant for it — proof that the checks can fail.

func broken(t *testing.T, b bugs, verify bool) *rig {
	t.Helper()
	inner := newMech(auth, 0)
	inner.bug = b
	return newRigOver(t, inner, verify)
}

// untruthful returns the ErrUntruthful finding inside err.
func untruthful(t *testing.T, err error) *memapi.Error {
	t.Helper()
	require.ErrorIs(t, err, memapi.ErrUntruthful)
	var found *memapi.Error
	var walk func(error) bool
	walk = func(e error) bool {
		var me *memapi.Error
		if errors.As(e, &me) && me.Kind == memapi.ErrUntruthful {
			found = me
			return true
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				if x != nil && walk(x) {
					return true
				}
			}
		}
		return false
	}
	require.True(t, walk(err), "no *memapi.Error of kind ErrUntruthful in %v", err)
	return found
}

// A commit that does nothing: an eager allocator's Commit succeeds and
// installs nothing. Verify mode reports it and gives the draw back, since
// nothing was installed; without verify mode the bug is silent.
func TestVerifyCatchesCommitThatDoesNothing(t *testing.T) {
	t.Run("verify", func(t *testing.T) {
		r := broken(t, bugs{commitNoop: true}, true)
		res := r.reserve(4 * testGran)
		err := r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g)
		me := untruthful(t, err)
		require.Equal(t, opCommit, me.Op)
		require.EqualValues(t, 2*testGran, me.Wanted)
		require.EqualValues(t, 0, me.Available)
		require.Contains(t, me.Detail, "CommittedBytes(res)")
		drawn, draws, undraws := r.g.state()
		require.Zero(t, drawn, "nothing was installed, so nothing stays drawn")
		require.Equal(t, 1, draws)
		require.Equal(t, 1, undraws)
	})
	t.Run("plain wrapper cannot see it", func(t *testing.T) {
		r := broken(t, bugs{commitNoop: true}, false)
		res := r.reserve(4 * testGran)
		require.NoError(t, r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g))
		drawn, _, _ := r.g.state()
		c, err := r.vb.CommittedBytes(res)
		require.NoError(t, err)
		require.EqualValues(t, 2*testGran, drawn)
		require.Zero(t, c, "the ledger and the mechanism now disagree")
	})
}

// Committed bytes misreported: the mechanism counts each Commit as one
// granule. Its committed figure and its used figure disagree, so the wrapper
// reports it and keeps the declared charge (the truth is unknown).
func TestVerifyCatchesMisreportedCommittedBytes(t *testing.T) {
	r := broken(t, bugs{commitCountsOnce: true}, true)
	res := r.reserve(4 * testGran)
	err := r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g)
	me := untruthful(t, err)
	require.EqualValues(t, 2*testGran, me.Wanted)
	require.EqualValues(t, testGran, me.Available)
	drawn, _, _ := r.g.state()
	require.EqualValues(t, 2*testGran, drawn)

	// A single-granule commit is reported right, and passes.
	require.NoError(t, r.vb.Commit(ctx, res, rng(2*testGran, testGran), r.g))
}

// Granularity ignored, at allocation: the mechanism takes req.Size exactly.
// Verify mode sees the used bytes and the handle's size off the rounded
// amount; the ledger keeps what was really taken, so the later Free balances.
func TestVerifyCatchesIgnoredAllocGranularity(t *testing.T) {
	r := broken(t, bugs{ignoreAllocRound: true}, true)
	a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1000}, r.g)
	me := untruthful(t, err)
	require.EqualValues(t, testAllocGran, me.Wanted)
	require.EqualValues(t, 1000, me.Available)
	require.NotNil(t, a, "the handle comes back with the error, so it can be freed")
	require.ErrorContains(t, err, "Allocation.Size()")
	drawn, _, _ := r.g.state()
	require.EqualValues(t, 1000, drawn, "the draw follows what was really taken")

	require.NoError(t, r.m.Free(ctx, a, r.acct))
	refunded, _ := r.acct.state()
	require.Equal(t, drawn, refunded)
}

// Granularity ignored, at commit: the mechanism accepts an unaligned range.
// The wrapper rejects it before the mechanism runs, with or without verify.
func TestWrapperRejectsUnalignedCommitTheMechanismWouldTake(t *testing.T) {
	inner := newMech(auth, 0)
	inner.bug.ignoreAlignment = true
	res, err := inner.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NoError(t, err)
	// The bare mechanism takes it: the bug is real.
	require.NoError(t, inner.Commit(ctx, res, rng(4096, 4096), newGrant(auth, 0)))

	modes(t, func(t *testing.T, verify bool) {
		r := newRigOver(t, inner, verify)
		calls := inner.count(mCommit)
		err := r.vb.Commit(ctx, res, rng(2*testGran+4096, 4096), r.g)
		requireKind(t, err, memapi.ErrUnaligned, opCommit)
		require.Equal(t, calls, inner.count(mCommit), "the mechanism was not called")
		_, draws, _ := r.g.state()
		require.Zero(t, draws)
	})
}

// Free of another mechanism's handle: this mechanism would free anything it
// is given. The wrapper rejects the foreign handle and never calls it.
func TestWrapperRejectsFreeOfAnotherMechanismsHandle(t *testing.T) {
	inner := newMech(auth, 0)
	inner.bug.freeAnyHandle = true
	own, err := inner.Allocate(ctx, memapi.AllocRequest{Size: 1}, newGrant(auth, 0))
	require.NoError(t, err)

	modes(t, func(t *testing.T, verify bool) {
		r := newRigOver(t, inner, verify)
		a := foreignAlloc(t)
		used, calls := inner.UsedBytes(), inner.count(mFree)
		err := r.m.Free(ctx, a, r.acct)
		requireKind(t, err, memapi.ErrForeignHandle, opFree)
		require.Equal(t, calls, inner.count(mFree), "the mechanism was not called")
		require.Equal(t, used, inner.UsedBytes())
		require.True(t, a.Live())
		_, refunds := r.acct.state()
		require.Zero(t, refunds)
	})

	// The bare mechanism does free it, corrupting its counter: the bug is real.
	require.NoError(t, inner.Free(ctx, foreignAlloc(t), newAccount(auth)))
	require.Zero(t, inner.UsedBytes(), "its own allocation is no longer counted")
	require.True(t, own.Live())
}

// An eager reservation takes physical memory without a grant: verify mode
// sees the used bytes move on a call that declares none, and returns the
// reservation with the error so that it can be released.
func TestVerifyCatchesEagerReserve(t *testing.T) {
	r := broken(t, bugs{eagerReserve: true}, true)
	res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 2 * testGran})
	me := untruthful(t, err)
	require.EqualValues(t, 0, me.Wanted)
	require.EqualValues(t, 2*testGran, me.Available)
	require.NotNil(t, res)
	require.True(t, res.Live())

	// Its release frees bytes that were never charged: reported, and nothing
	// is refunded for them.
	err = r.vb.ReleaseReservation(ctx, res, r.acct)
	untruthful(t, err)
	require.False(t, res.Live())
	refunded, _ := r.acct.state()
	require.Zero(t, refunded)
}

// A failed commit that left part of the range installed breaks
// no-partial-state: verify mode reports it beside the mechanism's error and
// keeps charged what really stayed installed.
func TestVerifyCatchesPartialFailure(t *testing.T) {
	r := broken(t, bugs{partialCommit: true}, true)
	res := r.reserve(4 * testGran)
	err := r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g)
	require.ErrorIs(t, err, memapi.ErrOutOfMemory)
	me := untruthful(t, err)
	require.EqualValues(t, 0, me.Wanted)
	require.EqualValues(t, testGran, me.Available)
	drawn, _, _ := r.g.state()
	require.EqualValues(t, testGran, drawn, "the installed granule stays charged")

	// Decommitting it refunds exactly that, and the ledger balances.
	require.NoError(t, r.vb.Decommit(ctx, res, rng(0, testGran), r.acct))
	refunded, _ := r.acct.state()
	require.Equal(t, drawn, refunded)
}

// A decommit that frees nothing must not refund anything.
func TestVerifyCatchesDecommitThatDoesNothing(t *testing.T) {
	r := broken(t, bugs{decommitNoop: true}, true)
	res := r.reserve(2 * testGran)
	r.commit(res, 0, testGran)
	err := r.vb.Decommit(ctx, res, rng(0, testGran), r.acct)
	me := untruthful(t, err)
	require.EqualValues(t, testGran, me.Wanted)
	require.Zero(t, me.Available)
	refunded, refunds := r.acct.state()
	require.Zero(t, refunded)
	require.Zero(t, refunds)
}

// An honest mechanism passes verify mode on every method (the positive
// control of the meta-tests is TestLedgerFollowsEveryMethod/verify).
func TestVerifyingOption(t *testing.T) {
	m := newMech(auth, 0)
	require.False(t, checked.Verifying(m))
	require.False(t, checked.Verifying(checked.Wrap(m, doubles)))
	require.True(t, checked.Verifying(checked.Wrap(m, doubles, checked.WithVerify())))
}

// A commit that installs more than asked: the figures agree on the larger
// growth, so the wrapper draws the excess too — the grant must cover what is
// really installed.
func TestVerifyDrawsWhatWasReallyInstalled(t *testing.T) {
	r := broken(t, bugs{commitExtra: true}, true)
	res := r.reserve(4 * testGran)
	err := r.vb.Commit(ctx, res, rng(0, testGran), r.g)
	me := untruthful(t, err)
	require.EqualValues(t, testGran, me.Wanted)
	require.EqualValues(t, 2*testGran, me.Available)
	drawn, draws, _ := r.g.state()
	require.EqualValues(t, 2*testGran, drawn)
	require.Equal(t, 2, draws)

	// When the grant cannot cover the excess, its refusal is reported too.
	r = broken(t, bugs{commitExtra: true}, true)
	r.g.limit = testGran
	res = r.reserve(4 * testGran)
	err = r.vb.Commit(ctx, res, rng(0, testGran), r.g)
	untruthful(t, err)
	require.ErrorIs(t, err, memapi.ErrGrantExhausted)
}

// A release that reports success but leaves the handle live, and one that
// releases the handle but reports failure: both are lies about the handle.
func TestVerifyChecksReleasedHandles(t *testing.T) {
	r := broken(t, bugs{freeKeepsLive: true}, true)
	a := r.alloc(1)
	err := r.m.Free(ctx, a, r.acct)
	me := untruthful(t, err)
	require.Contains(t, me.Detail, "a is still live")

	r = broken(t, bugs{unmapFailsLate: true}, true)
	v := r.view(r.reserve(testGran), 0, r.backing(testGran), memapi.AccessReadOnly)
	err = r.sm.UnmapView(ctx, v)
	require.ErrorIs(t, err, memapi.ErrInUse)
	me = untruthful(t, err)
	require.Contains(t, me.Detail, "failed but released v")
}

// A created handle that is not the mechanism's own is reported, with the
// handle check's own kind as the cause.
func TestVerifyChecksCreatedHandles(t *testing.T) {
	r := broken(t, bugs{allocForeign: true}, true)
	a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, r.g)
	require.NotNil(t, a)
	untruthful(t, err)
	require.ErrorIs(t, err, memapi.ErrForeignHandle)
}

// A figure that cannot be read is reported; the call's outcome stands on the
// figures that could be read.
func TestVerifyReportsUnreadableFigures(t *testing.T) {
	r := newRig(t, true)
	res := r.reserve(2 * testGran)
	boom := memapi.Errorf("VirtualBacking.CommittedBytes", memapi.ErrUnavailable, "device lost")
	r.inner.failNext(mCommittedBytes, boom)
	err := r.vb.Commit(ctx, res, rng(0, testGran), r.g)
	require.ErrorIs(t, err, memapi.ErrUnavailable)
	require.ErrorContains(t, err, "reading VirtualBacking.CommittedBytes(res)")
	require.NotErrorIs(t, err, memapi.ErrUntruthful)
	drawn, _, _ := r.g.state()
	require.EqualValues(t, testGran, drawn, "the used bytes moved as declared")
}
