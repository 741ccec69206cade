package pmm_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// Two tiers in one ledger: the device (authority "dev", VirtualBacking)
// and the host (authority "host"), each a fake mechanism with its own
// context, under one governor and one manager.

const hostTier = memapi.AuthorityID("host")

var host1 = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}

// armedFaults fails every governor operation named op on authority auth
// while armed, changing nothing.
type armedFaults struct {
	mu   sync.Mutex
	op   string
	auth memapi.AuthorityID
}

func (f *armedFaults) MaybeError(op memapi.Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.op == op.String() && f.auth == op.Authority {
		return errInjected
	}
	return nil
}

func (f *armedFaults) arm(op string, a memapi.AuthorityID) {
	f.mu.Lock()
	f.op, f.auth = op, a
	f.mu.Unlock()
}

type tierEnv struct {
	g               *governor.Governor
	mgr             *pmm.Manager
	inj             *armedFaults
	dev, host       *fakes.Mechanism
	devCtx, hostCtx *fakes.Context
	devEp, hostEp   *ep.Context
	kv, hostBind    *pmm.Binding
	region          *pmm.Region
	gran            memapi.Bytes
	pattern         []byte // what the region holds over its committed ranges
	committed       []memapi.Range
}

func newTierEnv(t *testing.T) *tierEnv {
	t.Helper()
	e := &tierEnv{inj: &armedFaults{}, gran: 64 << 10}
	e.g = governor.New(governor.Options{Injector: e.inj})
	t.Cleanup(func() { e.g.Close() })
	require.NoError(t, e.g.AddAuthority(auth, 1<<30))
	require.NoError(t, e.g.AddAuthority(hostTier, 1<<30))
	require.NoError(t, e.g.Register("kv", nil, governor.HolderOptions{}))
	require.NoError(t, e.g.Register("offload", nil, governor.HolderOptions{}))
	e.dev = fakes.NewMechanism(fakes.Config{Name: "dev", Authority: auth, Device: dev0})
	e.host = fakes.NewMechanism(fakes.Config{Name: "host", Authority: hostTier, Device: host1, Offers: memapi.Of(memapi.CapDeviceAllocator)})
	e.devCtx, e.hostCtx = fakes.NewContext(e.dev), fakes.NewContext(e.host)
	e.devEp, e.hostEp = ep.NewContext(e.devCtx, ep.Options{}), ep.NewContext(e.hostCtx, ep.Options{})
	mgr := pmm.New(e.g, pmm.Options{Verify: true})
	e.mgr = mgr
	require.NoError(t, mgr.Register(pmm.Device{Key: dev0, Mechanism: e.dev, Context: e.devEp, Authority: auth}))
	require.NoError(t, mgr.Register(pmm.Device{Key: host1, Mechanism: e.host, Context: e.hostEp, Authority: hostTier}))
	var err error
	e.kv, err = mgr.Bind("kv", "cache", dev0)
	require.NoError(t, err)
	e.hostBind, err = mgr.Bind("offload", "kv-offload", host1)
	require.NoError(t, err)
	e.region, err = e.kv.ReserveVirtual(context.Background(), 16*e.gran)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, e.region.Close())
		require.NoError(t, e.devEp.Close(ctx, true))
		require.NoError(t, e.hostEp.Close(ctx, true))
		e.exact(t)
		require.Zero(t, e.dev.UsedBytes())
		require.Zero(t, e.host.UsedBytes())
	})
	return e
}

// fill commits two ranges apart (a prefix and a sparse piece) and writes
// a pattern over them.
func (e *tierEnv) fill(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, e.region.Grow(ctx, 3*e.gran, nil))
	require.NoError(t, e.region.Commit(ctx, memapi.Range{Off: 8 * e.gran, Len: 2 * e.gran}))
	e.committed = []memapi.Range{{Off: 0, Len: 3 * e.gran}, {Off: 8 * e.gran, Len: 2 * e.gran}}
	e.pattern = make([]byte, 10*e.gran)
	for i := range e.pattern {
		e.pattern[i] = byte(i*7 + i>>16)
	}
	for _, r := range e.committed {
		e.copyIn(t, r)
	}
}

func (e *tierEnv) copyIn(t *testing.T, r memapi.Range) {
	t.Helper()
	s, err := e.devCtx.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.CopyToDevice(e.region.Addr()+memapi.DeviceAddr(r.Off), e.pattern[r.Off:r.Off+r.Len]))
	require.NoError(t, s.Synchronize(context.Background()))
}

// intact checks that the region holds the pattern over its committed ranges.
func (e *tierEnv) intact(t *testing.T) {
	t.Helper()
	s, err := e.devCtx.NewStream()
	require.NoError(t, err)
	defer s.Close()
	for _, r := range e.committed {
		got := make([]byte, r.Len)
		require.NoError(t, s.CopyFromDevice(got, e.region.Addr()+memapi.DeviceAddr(r.Off)))
		require.NoError(t, s.Synchronize(context.Background()))
		require.True(t, bytes.Equal(got, e.pattern[r.Off:r.Off+r.Len]), "bytes of [%#x, +%#x)", r.Off, r.Len)
	}
}

func (e *tierEnv) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, e.devEp.Queue().Drain(ctx))
	require.NoError(t, e.hostEp.Queue().Drain(ctx))
}

// exact checks, once the queues drained, that each authority's figures
// equal what its mechanism holds: no grant open, nothing pending, the
// charge (quarantined bytes included) the mechanism's used bytes.
func (e *tierEnv) exact(t *testing.T) {
	t.Helper()
	e.drain(t)
	for _, m := range []*fakes.Mechanism{e.dev, e.host} {
		a, ok := e.g.Authority(m.Info().Authority)
		require.True(t, ok)
		require.True(t, a.Balanced(), "%+v", a)
		require.Zero(t, a.Reserved, "%s: open grants", a.ID)
		require.Zero(t, a.Pending, "%s: pending", a.ID)
		require.Equal(t, m.UsedBytes(), a.Charged, "%s: charged against the mechanism's used bytes", a.ID)
	}
}

func (e *tierEnv) charged(t *testing.T, a memapi.AuthorityID) memapi.Bytes {
	t.Helper()
	s, ok := e.g.Authority(a)
	require.True(t, ok)
	return s.Charged
}

func TestOffloadRestoreKeepsAddressesAndBytes(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	e.fill(t)
	addr := e.region.Addr()
	const total = 5 * 64 << 10
	e.exact(t)
	require.Equal(t, memapi.Bytes(total), e.charged(t, auth))

	o, err := e.region.Offload(ctx, e.hostBind)
	require.NoError(t, err)
	require.Equal(t, e.committed, o.Ranges())
	require.Equal(t, memapi.Bytes(total), o.Bytes())
	e.exact(t)
	require.Zero(t, e.region.Committed(), "the ranges are holes")
	require.Zero(t, e.charged(t, auth), "the device tier holds nothing")
	require.Equal(t, memapi.Bytes(total), e.charged(t, hostTier), "the host tier holds the bytes")
	require.Equal(t, addr, e.region.Addr())
	require.Equal(t, 10*e.gran, e.region.Len(), "the region keeps its length")

	require.NoError(t, o.Restore(ctx))
	e.exact(t)
	require.Equal(t, memapi.Bytes(total), e.region.Committed())
	require.Equal(t, memapi.Bytes(total), e.charged(t, auth))
	require.Zero(t, e.charged(t, hostTier))
	require.Equal(t, addr, e.region.Addr())
	e.intact(t)

	require.ErrorIs(t, o.Restore(ctx), memapi.ErrReleased)
	require.ErrorIs(t, o.Discard(), memapi.ErrReleased)
	// The region works on: it can be offloaded again.
	o, err = e.region.Offload(ctx, e.hostBind)
	require.NoError(t, err)
	require.NoError(t, o.Restore(ctx))
	e.intact(t)
}

// One sequence's range (a preempted sequence's KV) moves alone; the rest
// of the region stays.
func TestOffloadOneRange(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	e.fill(t)
	seq := memapi.Range{Off: 8 * e.gran, Len: 2 * e.gran}
	o, err := e.region.Offload(ctx, e.hostBind, seq)
	require.NoError(t, err)
	e.exact(t)
	require.Equal(t, 3*e.gran, e.region.Committed())
	require.Equal(t, 2*e.gran, e.charged(t, hostTier))
	require.NoError(t, o.Restore(ctx))
	e.exact(t)
	e.intact(t)
}

// Discard drops the host copy; the ranges stay holes, backed again with
// zeros by a later Commit.
func TestOffloadDiscard(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	e.fill(t)
	o, err := e.region.Offload(ctx, e.hostBind)
	require.NoError(t, err)
	require.NoError(t, o.Discard())
	e.exact(t)
	require.Zero(t, e.charged(t, hostTier))
	require.Zero(t, e.charged(t, auth))
	require.ErrorIs(t, o.Restore(ctx), memapi.ErrReleased)
	require.NoError(t, e.region.Commit(ctx, memapi.Range{Off: 0, Len: e.gran}))
	s, err := e.devCtx.NewStream()
	require.NoError(t, err)
	defer s.Close()
	got := make([]byte, e.gran)
	require.NoError(t, s.CopyFromDevice(got, e.region.Addr()))
	require.NoError(t, s.Synchronize(ctx))
	require.Equal(t, make([]byte, e.gran), got)
}

func TestOffloadBadInput(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	e.fill(t)
	before := func() {
		e.exact(t)
		require.Equal(t, 5*e.gran, e.region.Committed())
		require.Zero(t, e.charged(t, hostTier))
	}

	_, err := e.region.Offload(ctx, nil)
	require.ErrorIs(t, err, memapi.ErrNilHandle)
	same, err := e.mgr.Bind("offload", "same-tier", dev0)
	require.NoError(t, err)
	_, err = e.region.Offload(ctx, same)
	require.ErrorIs(t, err, memapi.ErrInvalidRange, "a host binding on the region's own authority")
	for _, rng := range []memapi.Range{
		{Off: 3 * e.gran, Len: e.gran},     // a hole
		{Off: 2 * e.gran, Len: 2 * e.gran}, // half committed
	} {
		_, err = e.region.Offload(ctx, e.hostBind, rng)
		require.ErrorIs(t, err, memapi.ErrNotCommitted, "%v", rng)
	}
	for _, rng := range []memapi.Range{
		{Off: 0, Len: 100},              // not aligned
		{Off: 0, Len: 0},                // empty
		{Off: 12 * e.gran, Len: e.gran}, // beyond Len
	} {
		_, err = e.region.Offload(ctx, e.hostBind, rng)
		require.ErrorIs(t, err, memapi.ErrInvalidRange, "%v", rng)
	}
	_, err = e.region.Offload(ctx, e.hostBind, memapi.Range{Len: e.gran}, memapi.Range{Off: e.gran, Len: e.gran})
	require.ErrorIs(t, err, memapi.ErrInvalidRange, "touching ranges")
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = e.region.Offload(cctx, e.hostBind)
	require.ErrorIs(t, err, context.Canceled)
	before()

	// A range backed again while offloaded: Restore refuses, and the
	// bytes stay in the host copy.
	o, err := e.region.Offload(ctx, e.hostBind)
	require.NoError(t, err)
	e.drain(t)
	require.NoError(t, e.region.Commit(ctx, memapi.Range{Off: 9 * e.gran, Len: e.gran}))
	require.ErrorIs(t, o.Restore(ctx), memapi.ErrCommitted)
	require.Equal(t, 5*e.gran, e.charged(t, hostTier))
	require.NoError(t, e.region.Decommit(ctx, memapi.Range{Off: 9 * e.gran, Len: e.gran}))
	e.drain(t)
	require.NoError(t, o.Restore(ctx))
	e.intact(t)
	before()
}

// The copy reads what device work wrote: an offload waits for the work
// recorded on the region (bounded by its ctx, which refuses the offload
// with nothing changed), and goes ahead once it finished.
func TestOffloadWaitsForRecordedWork(t *testing.T) {
	e := newTierEnv(t)
	e.fill(t)
	s, err := e.devCtx.NewStream()
	require.NoError(t, err)
	e.devCtx.SetManualFences(true) // the fence completes when the test says
	f, err := s.Record()
	e.devCtx.SetManualFences(false)
	require.NoError(t, err)
	require.NoError(t, e.region.RecordUse(f))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = e.region.Offload(ctx, e.hostBind)
	require.ErrorIs(t, err, memapi.ErrInUse)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	e.exact(t)
	require.Equal(t, 5*e.gran, e.region.Committed())
	require.Zero(t, e.charged(t, hostTier))
	f.(*fakes.Fence).Complete()
	require.NoError(t, s.Close())
	o, err := e.region.Offload(context.Background(), e.hostBind)
	require.NoError(t, err)
	require.NoError(t, o.Restore(context.Background()))
	e.intact(t)
}

// A fault at every step of an offload and of a restore leaves the ledger
// exact on both tiers and the bytes whole in one place: the region either
// holds them all (awake) or none (asleep, the host copy holds them), and
// once the fault clears the move completes with the bytes intact.
func TestOffloadFaultAtEveryStep(t *testing.T) {
	type step struct {
		name    string
		restore bool // the fault is armed for the restore, not the offload
		arm     func(e *tierEnv)
	}
	fail := func(f interface{ Inject(fakes.Fault) }, method string) func(*tierEnv) {
		return func(*tierEnv) { f.Inject(fakes.Fault{Method: method, Err: errInjected}) }
	}
	steps := []step{
		{"offload: the host tier's reservation", false, func(e *tierEnv) { e.inj.arm("governor.Reserve", hostTier) }},
		{"offload: the host allocation", false, func(e *tierEnv) { fail(e.host, "Allocate")(e) }},
		{"offload: the host's grant commit", false, func(e *tierEnv) { e.inj.arm("governor.Grant.Commit", hostTier) }},
		{"offload: the copy out of the device", false, func(e *tierEnv) { fail(e.devCtx, "NewStream")(e) }},
		{"offload: the copy into the host", false, func(e *tierEnv) { fail(e.hostCtx, "NewStream")(e) }},
		{"offload: the device decommit (behind the fences)", false, func(e *tierEnv) { fail(e.dev, "Decommit")(e) }},
		{"offload: the device refund", false, func(e *tierEnv) { e.inj.arm("governor.Lease.Refund", auth) }},
		{"restore: the device reservation", true, func(e *tierEnv) { e.inj.arm("governor.Reserve", auth) }},
		{"restore: the device commit", true, func(e *tierEnv) { fail(e.dev, "Commit")(e) }},
		{"restore: the copy out of the host", true, func(e *tierEnv) { fail(e.hostCtx, "NewStream")(e) }},
		{"restore: the copy into the device", true, func(e *tierEnv) { fail(e.devCtx, "NewStream")(e) }},
		{"restore: the device grant commit", true, func(e *tierEnv) { e.inj.arm("governor.Grant.Commit", auth) }},
		{"restore: the grant commit and its rollback's decommit", true, func(e *tierEnv) {
			e.inj.arm("governor.Grant.Commit", auth)
			fail(e.dev, "Decommit")(e)
		}},
		{"restore: the host copy's free", true, func(e *tierEnv) { fail(e.host, "Free")(e) }},
		{"restore: the host copy's refund", true, func(e *tierEnv) { e.inj.arm("governor.Lease.Refund", hostTier) }},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			e := newTierEnv(t)
			ctx := context.Background()
			e.fill(t)
			clear := func() {
				e.inj.arm("", "")
				e.dev.ClearFaults()
				e.host.ClearFaults()
				e.devCtx.ClearFaults()
				e.hostCtx.ClearFaults()
			}
			// settle retries what a fault left quarantined, so that the
			// ledger check sees the bytes where they really are.
			settle := func() {
				e.drain(t)
				require.NoError(t, e.region.Retry(ctx))
				require.NoError(t, e.devEp.RetryQuarantined())
				require.NoError(t, e.hostEp.RetryQuarantined())
			}
			if !st.restore {
				st.arm(e)
			}
			o, err := e.region.Offload(ctx, e.hostBind)
			e.drain(t)
			clear()
			awake := e.region.Committed() == 5*e.gran
			if err != nil {
				require.True(t, awake, "a failed offload leaves the bytes in the region: %v", err)
				require.Nil(t, o)
			} else {
				require.Zero(t, e.region.Committed(), "an offload that returned leaves none in the region")
			}
			settle()
			e.exact(t)
			if awake {
				require.Zero(t, e.charged(t, hostTier))
				e.intact(t)
				return // the offload is the step that failed: done
			}
			require.Equal(t, 5*e.gran, e.charged(t, hostTier), "the host copy holds the bytes")

			if st.restore {
				st.arm(e)
			}
			err = o.Restore(ctx)
			e.drain(t)
			clear()
			switch c := e.region.Committed(); {
			case err == nil:
				require.Equal(t, 5*e.gran, c)
			case errors.Is(err, memapi.ErrReleased):
				t.Fatalf("restore: %v", err)
			default:
				require.Zero(t, c, "a failed restore leaves the region asleep: %v", err)
				settle()
				e.exact(t)
				require.Equal(t, 5*e.gran, e.charged(t, hostTier), "the host copy still holds the bytes")
				require.NoError(t, o.Restore(ctx), "the restore completes once the fault clears")
			}
			settle()
			e.exact(t)
			require.Equal(t, 5*e.gran, e.charged(t, auth))
			e.intact(t)
		})
	}
}

// A region closed while offloaded: Restore is refused, Discard frees the
// host copy, nothing stays charged on either tier.
func TestOffloadedRegionClosed(t *testing.T) {
	e := newTierEnv(t)
	ctx := context.Background()
	e.fill(t)
	o, err := e.region.Offload(ctx, e.hostBind)
	require.NoError(t, err)
	require.NoError(t, e.region.Close())
	require.ErrorIs(t, o.Restore(ctx), memapi.ErrClosed)
	require.NoError(t, o.Discard())
	e.exact(t)
	require.Zero(t, e.charged(t, hostTier))
	require.Zero(t, e.charged(t, auth))
}
