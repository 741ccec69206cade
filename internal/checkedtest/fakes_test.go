package checkedtest

import (
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// The wrapper over the generated fakes: the fakes' call counts and recorder
// show what reached the mechanism, their ledger what moved.

const fakeAuth memapi.AuthorityID = "fake"

type fakeRig struct {
	f    *fakes.Mechanism
	m    memapi.Mechanism
	vb   memapi.VirtualBacking
	sm   memapi.SharedMapping
	g    *fakes.Grant
	acct *fakes.Account
	rec  *fakes.Recorder
}

func newFakeRig(t *testing.T, cfg fakes.Config, verify bool) *fakeRig {
	t.Helper()
	rec := fakes.NewRecorder()
	cfg.Recorder = rec
	f := fakes.NewMechanism(cfg)
	r := &fakeRig{f: f, m: wrapWith(f, doubles, verify), g: fakes.NewGrant(fakeAuth, 1<<30), acct: fakes.NewAccount(fakeAuth), rec: rec}
	r.g.SetRecorder(rec)
	r.acct.SetRecorder(rec)
	r.vb, _ = r.m.AsVirtualBacking()
	r.sm, _ = r.m.AsSharedMapping()
	return r
}

// sinceMark returns the methods recorded after mark calls.
func (r *fakeRig) since(mark int) []string { return r.rec.Methods()[mark:] }

// TestFakesChargeBeforeCommit: the recorder shows the draw before the
// mechanism's commit, and the undraw after a commit that failed.
func TestFakesChargeBeforeCommit(t *testing.T) {
	r := newFakeRig(t, fakes.Config{}, false)
	res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NoError(t, err)

	mark := len(r.rec.Methods())
	require.NoError(t, r.vb.Commit(ctx, res, rng(0, testGran), r.g))
	require.Equal(t, []string{"grant:fake.Authority", "grant:fake.Draw", "fake.Commit"}, r.since(mark))
	require.EqualValues(t, testGran, r.g.Drawn())

	r.f.Inject(fakes.Fault{Method: "Commit", Nth: 2, Err: memapi.ErrOutOfMemory})
	mark = len(r.rec.Methods())
	err = r.vb.Commit(ctx, res, rng(testGran, testGran), r.g)
	require.ErrorIs(t, err, memapi.ErrOutOfMemory)
	require.Equal(t, []string{"grant:fake.Authority", "grant:fake.Draw", "fake.Commit", "grant:fake.Undraw"}, r.since(mark))
	require.EqualValues(t, testGran, r.g.Drawn(), "the failed commit's draw went back")

	mark = len(r.rec.Methods())
	require.NoError(t, r.vb.Decommit(ctx, res, rng(0, testGran), r.acct))
	require.Equal(t, []string{"account:fake.Authority", "fake.Decommit", "account:fake.Refund"}, r.since(mark))
	require.EqualValues(t, testGran, r.acct.Refunded())
}

// TestFakesRejectionsCallNothing: typed errors of the wrapper over the fake,
// with the fake's call counts and the fake ledger unchanged.
func TestFakesRejectionsCallNothing(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		r := newFakeRig(t, fakes.Config{}, verify)
		other := fakes.NewMechanism(fakes.Config{Name: "other"})
		og := fakes.NewGrant(fakeAuth, 1<<30)
		foreign, err := other.Allocate(ctx, memapi.AllocRequest{Size: 1}, og)
		require.NoError(t, err)
		res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
		require.NoError(t, err)
		a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, r.g)
		require.NoError(t, err)
		require.NoError(t, r.m.Free(ctx, a, r.acct))

		drawn, refunded, calls := r.g.Drawn(), r.acct.Refunded(), len(r.rec.Calls())
		commits, frees := r.f.CommitCallCount(), r.f.FreeCallCount()

		requireKind(t, r.m.Free(ctx, foreign, r.acct), memapi.ErrForeignHandle, opFree)
		requireKind(t, r.m.Free(ctx, a, r.acct), memapi.ErrReleased, opFree)
		requireKind(t, r.vb.Commit(ctx, res, rng(0, testGran), nil), memapi.ErrNoGrant, opCommit)
		requireKind(t, r.vb.Commit(ctx, res, rng(0, testGran), fakes.NewGrant("elsewhere", 1<<30)), memapi.ErrAuthorityMismatch, opCommit)
		requireKind(t, r.vb.Commit(ctx, res, rng(1, testGran), r.g), memapi.ErrUnaligned, opCommit)
		requireKind(t, r.vb.Commit(ctx, res, rng(0, 8*testGran), r.g), memapi.ErrInvalidRange, opCommit)
		requireKind(t, r.vb.Decommit(ctx, res, rng(0, testGran), nil), memapi.ErrNoAccount, opDecommit)

		require.Equal(t, commits, r.f.CommitCallCount())
		require.Equal(t, frees, r.f.FreeCallCount())
		require.Zero(t, r.f.DecommitCallCount())
		require.Equal(t, drawn, r.g.Drawn())
		require.Equal(t, refunded, r.acct.Refunded())
		for _, c := range r.rec.Calls()[calls:] {
			require.NotEqual(t, "fake", c.Source, "the fake was called: %+v", c)
			require.NotContains(t, []string{"Draw", "Undraw", "Refund"}, c.Method, "the ledger moved: %+v", c)
		}
		require.True(t, foreign.Live())
	})
}

// TestFakesLyingEagerIsCaught: the fakes' LyingEager mode reproduces the
// eager allocator. Verify mode reports its Reserve (physical bytes taken
// without a grant) and its Commit (nothing installed), and the grant keeps
// nothing for the commit; without verify mode the lie goes through.
func TestFakesLyingEagerIsCaught(t *testing.T) {
	r := newFakeRig(t, fakes.Config{LyingEager: true}, true)
	res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NotNil(t, res)
	me := untruthful(t, err)
	require.EqualValues(t, 4*testGran, me.Available)

	err = r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g)
	me = untruthful(t, err)
	require.EqualValues(t, 2*testGran, me.Wanted)
	require.Zero(t, me.Available)
	require.Zero(t, r.g.Drawn(), "nothing was installed, so nothing stays drawn")

	plain := newFakeRig(t, fakes.Config{LyingEager: true}, false)
	res, err = plain.vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NoError(t, err)
	require.NoError(t, plain.vb.Commit(ctx, res, rng(0, 2*testGran), plain.g))
	require.EqualValues(t, 2*testGran, plain.g.Drawn(), "charged for nothing: the bug verify mode exists for")
}

// TestFakesHonestUnderVerify: the honest fake passes verify mode through a
// full cycle of every capability, and the fake ledger balances.
func TestFakesHonestUnderVerify(t *testing.T) {
	r := newFakeRig(t, fakes.Config{}, true)
	a, err := r.m.Allocate(ctx, memapi.AllocRequest{Size: 1000}, r.g)
	require.NoError(t, err)
	res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NoError(t, err)
	require.NoError(t, r.vb.Commit(ctx, res, rng(0, 2*testGran), r.g))
	require.NoError(t, r.vb.Decommit(ctx, res, rng(testGran, testGran), r.acct))
	b, err := r.sm.CreateBacking(ctx, testGran, r.g)
	require.NoError(t, err)
	v, err := r.sm.MapView(ctx, res, rng(2*testGran, testGran), b, memapi.AccessReadOnly)
	require.NoError(t, err)
	nv, err := r.sm.CopyOnWrite(ctx, v, r.g)
	require.NoError(t, err)
	require.NoError(t, r.sm.UnmapView(ctx, nv))
	require.NoError(t, r.sm.ReleaseBacking(ctx, nv.Backing(), r.acct))
	require.NoError(t, r.sm.ReleaseBacking(ctx, b, r.acct))
	require.NoError(t, r.vb.ReleaseReservation(ctx, res, r.acct))
	require.NoError(t, r.m.Free(ctx, a, r.acct))
	require.Equal(t, r.g.Drawn(), r.acct.Refunded())
	require.Zero(t, r.f.UsedBytes())
}

// TestFakesStubbedLieIsCaught: a counterfeiter-style stub makes the fake's
// CommittedBytes report a fixed figure; verify mode sees it not move.
func TestFakesStubbedLieIsCaught(t *testing.T) {
	r := newFakeRig(t, fakes.Config{}, true)
	res, err := r.vb.Reserve(ctx, memapi.ReserveRequest{Size: 4 * testGran})
	require.NoError(t, err)
	r.f.CommittedBytesReturns(0, nil)
	err = r.vb.Commit(ctx, res, rng(0, testGran), r.g)
	me := untruthful(t, err)
	require.Contains(t, me.Detail, "CommittedBytes(res)")
	// The used bytes did move: the figures disagree, so the declared charge
	// stays (the truth is unknown to the wrapper).
	require.EqualValues(t, testGran, r.g.Drawn())
}

// TestFakesNegotiation: over fakes offering each subset, the wrapper offers
// the same.
func TestFakesNegotiation(t *testing.T) {
	da := memapi.Of(memapi.CapDeviceAllocator)
	for _, offers := range []memapi.CapSet{da, da | memapi.Of(memapi.CapVirtualBacking), da | memapi.Of(memapi.CapSharedMapping), 0} {
		f := fakes.NewMechanism(fakes.Config{Offers: offers})
		require.Equal(t, memapi.Negotiate(f), memapi.Negotiate(checked.Wrap(f, doubles)), "offers %v", offers)
	}
}
