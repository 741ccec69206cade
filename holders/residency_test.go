package holders_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/stretchr/testify/require"
)

func randomBytes(seed uint64, n int) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// readWeight uses a weight and reads its bytes back through the device.
func readWeight(t *testing.T, r *rig, s *holders.Residency, name string, n int) []byte {
	t.Helper()
	u, err := s.Use(context.Background(), name)
	require.NoError(t, err)
	defer u.Done()
	return read(t, r.devF, u.Addr, n)
}

// Offload copies a weight to a host-authority buffer and releases the
// device memory; Use reloads it. The bytes round-trip exactly, through a
// staging buffer smaller than the weight, and every figure moves as it
// should.
func TestResidencyOffloadReloadRoundTrip(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	s := r.residency(t, governor.HolderOptions{}, nil)
	ctx := context.Background()
	data := randomBytes(1, 10000) // not a multiple of the allocation granularity or the staging chunk
	require.NoError(t, s.Load(ctx, holders.WeightSpec{Name: "w", Data: data}))
	r.audit(t, "loaded")
	require.Equal(t, memapi.Bytes(12288), r.charged("weights", devAuth))

	freed, err := s.Reclaim(ctx, ticket(devAuth, 1))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(12288), freed)
	r.audit(t, "offloaded")
	require.Zero(t, r.charged("weights", devAuth))
	require.Equal(t, memapi.Bytes(12288), r.charged("weights", hostAuth))
	require.Zero(t, r.devM.UsedBytes())
	st := s.Stats()
	require.Equal(t, 1, st.Offloaded)
	require.Equal(t, uint64(1), st.Offloads)
	require.Equal(t, memapi.Bytes(10000), st.OffloadedBytes)
	require.False(t, s.Weights()[0].Resident)

	require.Equal(t, data, readWeight(t, r, s, "w", len(data)), "reloaded bytes equal the original")
	r.audit(t, "reloaded")
	require.Equal(t, memapi.Bytes(12288), r.charged("weights", devAuth))
	require.Zero(t, r.charged("weights", hostAuth), "the host copy was released")
	st = s.Stats()
	require.Equal(t, uint64(1), st.Reloads)
	require.Equal(t, 1, st.Resident)
	require.Equal(t, memapi.Bytes(10000), st.ReloadedTotal)

	// Twice more, to show nothing drifts.
	for range 2 {
		_, err := s.Reclaim(ctx, ticket(devAuth, 1))
		require.NoError(t, err)
		require.Equal(t, data, readWeight(t, r, s, "w", len(data)))
	}
	require.Equal(t, uint64(3), s.Stats().Offloads)
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes()+r.hostM.UsedBytes())
}

// Victim choice: coldest first; pinned, in-use, in-flight and hot weights
// never; tickets on another authority free 0.
func TestResidencyVictimChoice(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	now := time.Unix(1000, 0)
	var clockMu sync.Mutex
	clock := func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	advance := func(d time.Duration) { clockMu.Lock(); now = now.Add(d); clockMu.Unlock() }
	s := r.residency(t, governor.HolderOptions{}, func(c *holders.ResidencyConfig) {
		c.HotFor = time.Minute
		c.Clock = clock
	})
	ctx := context.Background()
	for _, name := range []string{"pinned", "a", "b", "c", "d"} {
		require.NoError(t, s.Load(ctx, holders.WeightSpec{Name: name, Size: gran, Pinned: name == "pinned"}))
	}
	// Everything was just used: hot, nothing moves.
	freed, err := s.Reclaim(ctx, ticket(devAuth, 1<<20))
	require.NoError(t, err)
	require.Zero(t, freed, "hot weights stay")

	advance(2 * time.Minute)
	// Use order now: b, then a (a is warmest of the cold); c is open; d's
	// work is in flight.
	for _, name := range []string{"b", "a"} {
		u, err := s.Use(ctx, name)
		require.NoError(t, err)
		u.Done()
	}
	advance(2 * time.Minute)
	open, err := s.Use(ctx, "c")
	require.NoError(t, err)
	steps := fakes.NewContext(r.devM)
	steps.SetManualFences(true)
	st, err := steps.NewStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()); require.NoError(t, steps.Close()) }()
	f, err := st.Record()
	require.NoError(t, err)
	ud, err := s.Use(ctx, "d")
	require.NoError(t, err)
	require.NoError(t, ud.RecordUse(f))
	ud.Done()
	advance(2 * time.Minute)

	freed, err = s.Reclaim(ctx, ticket(hostAuth, 1<<20))
	require.NoError(t, err)
	require.Zero(t, freed, "host tickets: the host copies are the only copies")

	freed, err = s.Reclaim(ctx, ticket(devAuth, 1))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(gran), freed)
	require.Equal(t, map[string]bool{"pinned": true, "a": true, "b": false, "c": true, "d": true}, resident(s), "b is the coldest")

	freed, err = s.Reclaim(ctx, ticket(devAuth, 1<<20))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(gran), freed, "only a was left to take")
	require.Equal(t, map[string]bool{"pinned": true, "a": false, "b": false, "c": true, "d": true}, resident(s))

	f.(*fakes.Fence).Complete()
	freed, err = s.Reclaim(ctx, ticket(devAuth, 1<<20))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(gran), freed, "d's fence completed")
	open.Done()
	require.NoError(t, s.Pin("c", true))
	freed, err = s.Reclaim(ctx, ticket(devAuth, 1<<20))
	require.NoError(t, err)
	require.Zero(t, freed, "c is pinned now")
	require.Equal(t, uint64(6), s.Stats().Tickets)
	require.ErrorIs(t, s.Pin("nope", true), memapi.ErrInvalidRange)

	require.NoError(t, s.Close())
	r.audit(t, "end")
}

func resident(s *holders.Residency) map[string]bool {
	out := map[string]bool{}
	for _, w := range s.Weights() {
		out[w.Name] = w.Resident
	}
	return out
}

// Pressure through the governor: loading a weight that does not fit makes
// the governor ask the store, which offloads the coldest weight.
func TestResidencyPressureFromItsOwnLoad(t *testing.T) {
	r := newRig(t, 3*gran, 1<<20)
	s := r.residency(t, governor.HolderOptions{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws := map[string][]byte{}
	for i, name := range []string{"w0", "w1", "w2", "w3", "w4"} {
		ws[name] = randomBytes(uint64(i), gran)
		require.NoError(t, s.Load(ctx, holders.WeightSpec{Name: name, Data: ws[name]}))
		r.audit(t, "load")
	}
	require.Equal(t, map[string]bool{"w0": false, "w1": false, "w2": true, "w3": true, "w4": true}, resident(s))
	// Using all of them in turn reloads and offloads; every byte survives.
	for range 2 {
		for _, name := range []string{"w0", "w1", "w2", "w3", "w4"} {
			require.Equal(t, ws[name], readWeight(t, r, s, name, gran), name)
		}
	}
	st := s.Stats()
	require.NotZero(t, st.Reloads)
	require.Equal(t, st.Offloads, st.Reloads+2)
	r.audit(t, "used")
	a, _ := r.g.Authority(devAuth)
	require.Equal(t, st.Tickets, a.Tickets)
	require.NoError(t, s.Close())
	r.audit(t, "end")
}

// A failed offload (the copy fails) leaves the weight resident and the host
// copy released; a failed reload leaves it offloaded.
func TestResidencyFailedMovesChangeNothing(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	s := r.residency(t, governor.HolderOptions{}, nil)
	ctx := context.Background()
	data := randomBytes(3, 5000)
	require.NoError(t, s.Load(ctx, holders.WeightSpec{Name: "w", Data: data}))
	boom := errors.New("boom")

	r.devF.Inject(fakes.Fault{Method: "CopyFromDevice", Err: boom})
	freed, err := s.Reclaim(ctx, ticket(devAuth, 1))
	require.ErrorIs(t, err, boom)
	require.Zero(t, freed)
	r.devF.ClearFaults()
	require.True(t, resident(s)["w"])
	r.audit(t, "failed offload")
	require.Zero(t, r.hostM.UsedBytes())

	_, err = s.Reclaim(ctx, ticket(devAuth, 1))
	require.NoError(t, err)
	r.hostF.Inject(fakes.Fault{Method: "CopyFromDevice", Err: boom})
	_, err = s.Use(ctx, "w")
	require.ErrorIs(t, err, boom)
	r.hostF.ClearFaults()
	require.False(t, resident(s)["w"])
	r.audit(t, "failed reload")
	require.Zero(t, r.devM.UsedBytes())
	require.Equal(t, data, readWeight(t, r, s, "w", len(data)))

	// Allocation failures at either end.
	_, err = s.Reclaim(ctx, ticket(devAuth, 1))
	require.NoError(t, err)
	r.devM.Inject(fakes.Fault{Method: "Allocate", Err: memapi.ErrOutOfMemory})
	_, err = s.Use(ctx, "w")
	require.ErrorIs(t, err, memapi.ErrOutOfMemory)
	r.devM.ClearFaults()
	require.Equal(t, data, readWeight(t, r, s, "w", len(data)))
	r.hostM.Inject(fakes.Fault{Method: "Allocate", Err: memapi.ErrOutOfMemory})
	_, err = s.Reclaim(ctx, ticket(devAuth, 1))
	require.ErrorIs(t, err, memapi.ErrOutOfMemory)
	r.hostM.ClearFaults()
	require.True(t, resident(s)["w"])
	r.audit(t, "failed allocations")

	r.devM.Inject(fakes.Fault{Method: "Allocate", Err: memapi.ErrOutOfMemory})
	require.ErrorIs(t, s.Load(ctx, holders.WeightSpec{Name: "x", Size: 100}), memapi.ErrOutOfMemory)
	r.devM.ClearFaults()
	require.Len(t, s.Weights(), 1, "a failed load leaves nothing")
	require.NoError(t, s.Load(ctx, holders.WeightSpec{Name: "x", Size: 100}))
	require.ErrorIs(t, s.Load(ctx, holders.WeightSpec{Name: "x", Size: 100}), memapi.ErrInUse)
	require.ErrorIs(t, s.Load(ctx, holders.WeightSpec{Name: "y"}), memapi.ErrInvalidSize)

	u, err := s.Use(ctx, "x")
	require.NoError(t, err)
	require.ErrorIs(t, s.Unload("x"), memapi.ErrInUse)
	require.ErrorIs(t, s.Close(), memapi.ErrInUse)
	u.Done()
	u.Done() // idempotent
	require.NoError(t, s.Unload("x"))
	_, err = s.Use(ctx, "x")
	require.ErrorIs(t, err, memapi.ErrInvalidRange)
	require.NoError(t, s.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes()+r.hostM.UsedBytes())
}

func TestResidencyNeedsAnotherAuthority(t *testing.T) {
	r := newRig(t, 1<<20, 1<<20)
	_, err := holders.NewResidency(holders.ResidencyConfig{Manager: r.mgr, Device: devKey, DeviceContext: r.devF, Host: devKey, HostContext: r.devF})
	require.ErrorIs(t, err, memapi.ErrAuthorityMismatch)
	_, err = holders.NewResidency(holders.ResidencyConfig{Manager: r.mgr, Device: devKey})
	require.ErrorIs(t, err, memapi.ErrNilHandle)
}

// A full host pool cannot hold a ticket for ever: the offload gives up after
// OffloadTimeout, the weight stays resident, and the host ticket that the
// offload's own reservation raised was answered with 0.
func TestResidencyOffloadToFullHostTimesOut(t *testing.T) {
	r := newRig(t, 1<<20, 2*gran)
	s := r.residency(t, governor.HolderOptions{}, func(c *holders.ResidencyConfig) { c.OffloadTimeout = 20 * time.Millisecond })
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		require.NoError(t, s.Load(ctx, holders.WeightSpec{Name: name, Size: 2 * gran}))
	}
	freed, err := s.Reclaim(ctx, ticket(devAuth, 1))
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(2*gran), freed, "the first fills the host")
	freed, err = s.Reclaim(ctx, ticket(devAuth, 1))
	require.ErrorIs(t, err, memapi.ErrOverBudget)
	require.Zero(t, freed)
	require.Equal(t, 1, s.Stats().Resident)
	require.Equal(t, 1, s.Stats().Offloaded)
	r.audit(t, "after")
	require.NoError(t, s.Close())
	r.audit(t, "end")
}
