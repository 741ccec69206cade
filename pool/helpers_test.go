package pool_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/pmm"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var dev0 = memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 0}

const auth = memapi.AuthorityID("dev")

// env is a pool over a fake mechanism, governed by a real governor.
type env struct {
	g    *governor.Governor
	mgr  *pmm.Manager
	m    *fakes.Mechanism
	fctx *fakes.Context
	ectx *ep.Context
	p    *pool.Pool
}

// tb is what the helpers need of a test: a *testing.T, or a *rapid.T in
// the model test, whose cleanups then run at the end of each check.
type tb interface {
	require.TestingT
	Helper()
	Cleanup(func())
}

// setup makes the env; an empty opts.Backing means BackingSegments here
// (tests of the region say so).
func setup(t tb, capacity memapi.Bytes, opts pool.Options) *env {
	t.Helper()
	if opts.Backing == "" {
		opts.Backing = pool.BackingSegments
	}
	return setupWith(t, capacity, opts, fakes.Config{})
}

func setupWith(t tb, capacity memapi.Bytes, opts pool.Options, cfg fakes.Config) *env {
	t.Helper()
	cfg.Authority = auth
	m := fakes.NewMechanism(cfg)
	fctx := fakes.NewContext(m)
	ectx := ep.NewContext(fctx, ep.Options{})
	g := governor.New(governor.Options{})
	require.NoError(t, g.AddAuthority(auth, capacity))
	mgr := pmm.New(g, pmm.Options{Verify: true})
	require.NoError(t, mgr.Register(pmm.Device{Key: dev0, Mechanism: m, Context: ectx, Authority: auth}))
	b, err := mgr.Bind("pool", "workspace", dev0)
	require.NoError(t, err)
	p, err := pool.New(b, opts)
	require.NoError(t, err)
	require.NoError(t, g.Register("pool", p, governor.HolderOptions{Cache: true}))
	e := &env{g: g, mgr: mgr, m: m, fctx: fctx, ectx: ectx, p: p}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m.ClearFaults()
		watchdog.Within(t, 30*time.Second, "Pool.Close", func() {
			_ = p.Close()
			_ = p.Close() // retries what a fault made fail before
		})
		fctx.CompleteAll()
		require.NoError(t, mgr.Close(ctx))
		require.NoError(t, ectx.Close(ctx, true))
		require.NoError(t, g.Close())
	})
	return e
}

func (e *env) drain(t tb) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, e.ectx.Queue().Drain(ctx))
}

func (e *env) holder(id governor.HolderID) governor.HolderAuthoritySnapshot {
	for _, h := range e.g.Snapshot().Holders {
		if h.ID == id {
			for _, a := range h.Authorities {
				if a.Authority == auth {
					return a
				}
			}
		}
	}
	return governor.HolderAuthoritySnapshot{}
}

// awaitTicket waits until the pool's holder has answered more than
// tickets pressure tickets (a reservation asked it and now waits).
func (e *env) awaitTicket(t tb, tickets uint64, what string) {
	t.Helper()
	watchdog.Within(t, watchdog.Bound, what, func() {
		for e.holder("pool").Tickets == tickets {
			time.Sleep(time.Millisecond)
		}
	})
}

// checkLedger asserts the ledger identity (release.go): once drained, the
// governor charges the pool's holder exactly its segments and the backing
// whose release failed (quarantined, and booked so), nothing is pending, the
// mechanism holds the same bytes, and cached + in use == segments.
func (e *env) checkLedger(t tb) pool.Stats {
	t.Helper()
	e.drain(t)
	s := e.p.Stats()
	h := e.holder("pool")
	require.Equal(t, s.Segments+s.Quarantined, h.Charged, "charged == segments + quarantined")
	require.Equal(t, s.Quarantined, h.Quarantined, "the pool's quarantined bytes are the ledger's")
	require.Zero(t, h.Pending)
	require.Equal(t, s.Segments+s.Quarantined, e.m.UsedBytes(), "mechanism holds the segments and the quarantined bytes")
	require.Equal(t, s.Segments, s.Cached+s.InUse, "cached + in use == segments")
	return s
}

var noDeadline time.Time

func pattern(i, n int) []byte {
	p := make([]byte, n)
	for k := range p {
		p[k] = byte(i*31 + k*7 + 1)
	}
	return p
}

func slicesSort(d []time.Duration) { slices.Sort(d) }

// stream makes a stream of the fake context, closed at the test's end.
func (e *env) stream(t tb) memapi.Stream {
	t.Helper()
	s, err := e.fctx.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}
