package pmm_test

import (
	"context"
	"testing"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/stretchr/testify/require"
)

// A rollback that fails after the grant could not commit (Allocate's Free,
// CreateShared's and CopyOnWrite's ReleaseBacking) kept the drawn bytes in
// the open grant: visible as reserved, but nothing ever retried them, so
// the ledger never returned to zero. Now the leftover is quarantined on the
// context: visible and pinned while the fault lasts, freed and the grant
// cancelled by RetryQuarantined or Manager.Close once it clears.
func TestFailedRollbackIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		bytes  memapi.Bytes
		// fail makes the failing call, arming the faults just before it.
		fail func(t *testing.T, e *env, arm func()) error
	}{
		{"allocate", "Free", 4096, func(t *testing.T, e *env, arm func()) error {
			b := e.bind(t, "w", "weights")
			arm()
			_, err := b.Allocate(context.Background(), 4096)
			return err
		}},
		{"create-shared", "ReleaseBacking", gran, func(t *testing.T, e *env, arm func()) error {
			b := e.bind(t, "p", "prompt")
			arm()
			_, err := b.CreateShared(context.Background(), gran)
			return err
		}},
		{"copy-on-write", "ReleaseBacking", gran, func(t *testing.T, e *env, arm func()) error {
			ctx := context.Background()
			b := e.bind(t, "p", "kv")
			sh, err := b.CreateShared(ctx, gran)
			require.NoError(t, err)
			r, err := b.ReserveVirtual(ctx, 4*gran)
			require.NoError(t, err)
			_, err = r.MapShared(ctx, sh, memapi.AccessReadOnly)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, r.Close()); require.NoError(t, sh.Close()) })
			arm()
			return r.CopyOnWrite(ctx, 0)
		}},
	} {
		for _, settle := range []string{"retry", "manager-close"} {
			t.Run(tc.name+"/"+settle, func(t *testing.T) {
				e := setup(t, fakes.Config{})
				var (
					base figures
					used memapi.Bytes
				)
				err := tc.fail(t, e, func() {
					base, used = e.l.snapshot(), e.m.UsedBytes()
					e.l.failCommit = -1
					e.m.Inject(fakes.Fault{Method: tc.method, Err: memapi.ErrUnavailable})
				})
				require.ErrorIs(t, err, ep.ErrQuarantined)
				require.ErrorIs(t, err, errInjected)
				stuck := figures{Reserved: tc.bytes, Drawn: tc.bytes}
				base.Reserved += tc.bytes
				base.Drawn += tc.bytes
				require.Equal(t, base, e.l.snapshot(), "visible while stuck: reserved and drawn")
				require.Equal(t, used+tc.bytes, e.m.UsedBytes())
				require.Equal(t, 1, e.ectx.Quarantined(), "reachable for a retry")
				require.ErrorIs(t, e.ectx.QuarantineErrors()[0], ep.ErrQuarantined)
				// A retry while the fault lasts keeps everything visible.
				require.NoError(t, e.ectx.RetryQuarantined())
				e.drain(t)
				require.Equal(t, base, e.l.snapshot())
				e.m.ClearFaults()
				e.l.failCommit = 0
				if settle == "retry" {
					require.NoError(t, e.ectx.RetryQuarantined())
					e.drain(t)
				} else {
					err := e.mgr.Close(context.Background())
					if tc.name != "copy-on-write" { // which still holds its region and backing
						require.NoError(t, err)
					}
				}
				base.Reserved -= stuck.Reserved
				base.Drawn -= stuck.Drawn
				require.Equal(t, base, e.l.snapshot(), "the leftover was freed and its grant cancelled")
				require.Equal(t, used, e.m.UsedBytes())
				require.Zero(t, e.ectx.Quarantined())
			})
		}
	}
}

// The retry of a failed rollback whose free succeeded but whose grant
// cancel failed only cancels the next time: it never frees twice.
func TestFailedRollbackRetryCancelsOnly(t *testing.T) {
	e := setup(t, fakes.Config{})
	b := e.bind(t, "w", "weights")
	e.l.failCommit = -1
	e.m.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrUnavailable})
	_, err := b.Allocate(context.Background(), 4096)
	require.ErrorIs(t, err, ep.ErrQuarantined)
	e.m.ClearFaults()
	e.l.failCommit = 0
	e.l.failCancel = e.l.cancels + 1
	require.NoError(t, e.ectx.RetryQuarantined())
	e.drain(t)
	require.Equal(t, figures{Reserved: 4096}, e.l.snapshot(), "freed into the grant, which is still open")
	require.Zero(t, e.m.UsedBytes())
	require.Equal(t, 1, e.ectx.Quarantined())
	require.NoError(t, e.ectx.RetryQuarantined())
	e.settled(t)
	require.Zero(t, e.ectx.Quarantined())
	require.Equal(t, 2, e.m.FreeCallCount(), "one failed free, then one that freed: never twice")
}
