package holders_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

const (
	devAuth  = memapi.AuthorityID("dev")
	hostAuth = memapi.AuthorityID("host")
	gran     = 4096
)

var (
	devKey  = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 0}
	hostKey = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}
	// shape: 2 x 2 layers x 2 heads x 64 dims x 2 bytes = 1 KiB per token,
	// so 4 tokens fill a 4 KiB chunk.
	shape = holders.ModelShape{Layers: 2, KVHeads: 2, HeadDim: 64, DTypeBytes: 2}
)

// rig is a governor, a manager and two fake devices (a "device" and a
// "host") on separate authorities.
type rig struct {
	g                *governor.Governor
	mgr              *pmm.Manager
	devM, hostM      *fakes.Mechanism
	devF, hostF      *fakes.Context
	devCtx, hostCtx  *ep.Context
	devUsed, hostUse func() memapi.Bytes
}

func newRig(t *testing.T, devCap, hostCap memapi.Bytes) *rig {
	t.Helper()
	g := governor.New(governor.Options{})
	require.NoError(t, g.AddAuthority(devAuth, devCap))
	require.NoError(t, g.AddAuthority(hostAuth, hostCap))
	devM := fakes.NewMechanism(fakes.Config{Name: "dev", Authority: devAuth, Device: devKey, Granularity: gran, Quiet: true})
	hostM := fakes.NewMechanism(fakes.Config{Name: "host", Authority: hostAuth, Device: hostKey, Granularity: gran, Quiet: true})
	r := &rig{g: g, devM: devM, hostM: hostM, devF: fakes.NewContext(devM), hostF: fakes.NewContext(hostM)}
	r.devCtx = ep.NewContext(r.devF, ep.Options{})
	r.hostCtx = ep.NewContext(r.hostF, ep.Options{})
	r.devUsed, r.hostUse = devM.UsedBytes, hostM.UsedBytes
	r.mgr = pmm.New(g, pmm.Options{Verify: true})
	require.NoError(t, r.mgr.Register(pmm.Device{Key: devKey, Mechanism: devM, Context: r.devCtx, Authority: devAuth}))
	require.NoError(t, r.mgr.Register(pmm.Device{Key: hostKey, Mechanism: hostM, Context: r.hostCtx, Authority: hostAuth}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Errors, not FailNow: a cleanup must not hide a test's panic.
		if err := errors.Join(r.devCtx.Close(ctx, true), r.hostCtx.Close(ctx, true), g.Close()); err != nil {
			t.Error(err)
		}
	})
	return r
}

func (r *rig) drain(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.devCtx.Queue().Drain(ctx))
	require.NoError(t, r.hostCtx.Queue().Drain(ctx))
}

// audit drains the queues and checks, per authority, that the ledger is
// balanced and that charged + pending is what the mechanism holds.
func (r *rig) audit(t *testing.T, when string) {
	t.Helper()
	r.drain(t)
	for _, c := range []struct {
		auth memapi.AuthorityID
		used func() memapi.Bytes
	}{{devAuth, r.devUsed}, {hostAuth, r.hostUse}} {
		a, ok := r.g.Authority(c.auth)
		require.True(t, ok)
		require.True(t, a.Balanced(), "%s: %s ledger unbalanced: %+v", when, c.auth, a)
		require.Zero(t, a.Reserved, "%s: %s grants left open", when, c.auth)
		require.Equal(t, a.Charged+a.Pending, c.used(), "%s: %s ledger vs mechanism", when, c.auth)
	}
}

// charged returns the bytes charged to holder on auth.
func (r *rig) charged(holder string, auth memapi.AuthorityID) memapi.Bytes {
	for _, h := range r.g.Snapshot().Holders {
		if string(h.ID) != holder {
			continue
		}
		for _, a := range h.Authorities {
			if a.Authority == auth {
				return a.Charged + a.Pending
			}
		}
	}
	return 0
}

func (r *rig) kv(t *testing.T, opts governor.HolderOptions, mod func(*holders.KVConfig)) *holders.KVStore {
	t.Helper()
	cfg := holders.KVConfig{Manager: r.mgr, Device: devKey, Shape: shape, Context: r.devF, Priority: int(opts.Priority)}
	if mod != nil {
		mod(&cfg)
	}
	s, err := holders.NewKVStore(cfg)
	require.NoError(t, err)
	require.NoError(t, r.g.Register(governor.HolderID(s.Holder()), s, opts))
	return s
}

func (r *rig) residency(t *testing.T, opts governor.HolderOptions, mod func(*holders.ResidencyConfig)) *holders.Residency {
	t.Helper()
	cfg := holders.ResidencyConfig{Manager: r.mgr, Device: devKey, DeviceContext: r.devF, Host: hostKey, HostContext: r.hostF, Priority: int(opts.Priority), Staging: 3000}
	if mod != nil {
		mod(&cfg)
	}
	s, err := holders.NewResidency(cfg)
	require.NoError(t, err)
	require.NoError(t, r.g.Register(governor.HolderID(s.Holder()), s, opts))
	return s
}

// read copies n bytes at addr out of the context.
func read(t *testing.T, dc memapi.DeviceContext, addr memapi.DeviceAddr, n int) []byte {
	t.Helper()
	s, err := dc.NewStream()
	require.NoError(t, err)
	defer s.Close()
	b := make([]byte, n)
	require.NoError(t, s.CopyFromDevice(b, addr))
	require.NoError(t, s.Synchronize(context.Background()))
	return b
}

// write copies b to addr through the context and returns the error of the
// copy.
func write(t *testing.T, dc memapi.DeviceContext, addr memapi.DeviceAddr, b []byte) error {
	t.Helper()
	s, err := dc.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.CopyToDevice(addr, b))
	return s.Synchronize(context.Background())
}

func ticket(auth memapi.AuthorityID, n memapi.Bytes) governor.Ticket {
	return governor.Ticket{ID: 1, Authority: auth, Wanted: n}
}
