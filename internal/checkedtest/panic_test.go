package checkedtest

import (
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// TestPanicUndraws: when the mechanism panics inside a consuming call, the
// wrapper gives the draw back to the grant and the panic goes on, with its
// own value, to the caller. Removing the deferred undraw leaves the bytes
// drawn and fails this test.
func TestPanicUndraws(t *testing.T) {
	modes(t, func(t *testing.T, verify bool) {
		for _, k := range []method{mAllocate, mCommit, mCreateBacking, mCopyOnWrite} {
			t.Run(k.String(), func(t *testing.T) {
				r := newRig(t, verify)
				res := r.reserve(4 * testGran)
				var v *memapi.View
				if k == mCopyOnWrite {
					v = r.view(res, 0, r.backing(testGran), memapi.AccessReadOnly)
				}
				drawn, _, _ := r.g.state()
				r.inner.panicNext(k, "mechanism bug")
				require.PanicsWithValue(t, "mechanism bug", func() {
					switch k {
					case mAllocate:
						_, _ = r.m.Allocate(ctx, memapi.AllocRequest{Size: 1}, r.g)
					case mCommit:
						_ = r.vb.Commit(ctx, res, rng(testGran, testGran), r.g)
					case mCreateBacking:
						_, _ = r.sm.CreateBacking(ctx, testGran, r.g)
					case mCopyOnWrite:
						_, _ = r.sm.CopyOnWrite(ctx, v, r.g)
					}
				})
				after, draws, undraws := r.g.state()
				require.Equal(t, drawn, after, "the draw is given back")
				require.Positive(t, draws)
				require.Positive(t, undraws)
				// The wrapper is still usable (verify mode's lock was released).
				a := r.alloc(1)
				require.NoError(t, r.m.Free(ctx, a, r.acct))
			})
		}
	})
}
