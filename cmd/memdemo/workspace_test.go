package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/memreport"
	"github.com/memgen/memgen/pool"
	"github.com/stretchr/testify/require"
)

// TestWorkspaceSizes: a step's activations follow the batch and the shape,
// and at the default shape both the pool's size classes and its arena
// serve them.
func TestWorkspaceSizes(t *testing.T) {
	cfg := DefaultConfig()
	w := &workspace{shape: memapi.Bytes(cfg.Shape.KVHeads * cfg.Shape.HeadDim * cfg.Shape.DTypeBytes), vocab: memapi.Bytes(cfg.Vocab), layer: cfg.Shape.Layers}
	one := w.sizes(1)
	require.Len(t, one, 4*cfg.Shape.Layers+1)
	// Per layer: residual, fused QKV, attention output, MLP up-projection
	// (hidden = 4 x 64 x 2 B = 512 B per request); the logits in fp32.
	require.Equal(t, []memapi.Bytes{512, 1536, 512, 2048}, one[:4])
	require.Equal(t, memapi.Bytes(4096*4), one[len(one)-1])
	small, large := 0, 0
	for i, n := range w.sizes(58) {
		require.Equal(t, 58*one[i], n, "linear in the batch")
		if n <= pool.SmallMax {
			small++
		} else {
			large++
		}
	}
	require.NotZero(t, small, "size classes serve the small activations")
	require.NotZero(t, large, "the arena serves the large ones")
	w.vocab = 0
	require.Len(t, w.sizes(3), 4*cfg.Shape.Layers, "no logits without a vocabulary")
}

// TestPressureRoundsCachesFirst: the check of the device's pressure rounds
// fails a round that asks another holder before the pool while the pool
// holds bytes, or that preempts or offloads while the pool's idle cache
// covers the shortfall; it counts the rest.
func TestPressureRoundsCachesFirst(t *testing.T) {
	st := pool.Stats{}
	p := &pressureRounds{auth: "device"}
	p.setPool(func() pool.Stats { return st })
	press := func(requester governor.HolderID, short memapi.Bytes, asked ...governor.HolderID) {
		p.event(governor.Event{Kind: governor.EventPressure, Authority: "device", Holder: requester, Bytes: short, Time: simEpoch})
		for _, h := range asked {
			p.event(governor.Event{Kind: governor.EventTicket, Authority: "device", Holder: h})
			p.event(governor.Event{Kind: governor.EventReclaimed, Authority: "device", Holder: h, Bytes: 1})
		}
	}
	// Another authority's rounds are not the device's.
	p.event(governor.Event{Kind: governor.EventPressure, Authority: "host", Holder: holderSecond, Bytes: 1})
	p.event(governor.Event{Kind: governor.EventTicket, Authority: "host", Holder: holderSecond})

	press(holderKV, 100, holderSecond, holderKV) // the pool holds nothing yet
	st = pool.Stats{Segments: 1000, Cached: 1000}
	press(holderKV, 100, holderPool)                         // the cache answers alone
	press(holderSecond, 2000, holderPool, holderKV)          // beyond the cache
	press(holderKV, 100)                                     // refunds on their way
	st = pool.Stats{Segments: 1000, Cached: 600, InUse: 400} // a step in flight
	press(holderPool, 300, holderPool, holderSecond)         // its own growth: its cache first, then others
	press(holderKV, 300, holderPool, holderKV)               // not idle: its cache may not cover
	f := p.figures()
	require.Zero(t, f.Violations, "%q", f.ViolationLog)
	require.Equal(t, pressureFigures{Rounds: 6, PoolFirst: 4, PoolAlone: 1, PoolEmpty: 1, NoTicket: 1, PoolFreed: 4, ViolationLog: []string{}}, withLog(f))

	// Another holder asked first while the pool held bytes.
	press(holderKV, 100, holderSecond, holderPool)
	// The idle cache covered the shortfall, yet requests were preempted.
	st = pool.Stats{Segments: 1000, Cached: 1000}
	press(holderSecond, 500, holderPool, holderKV)
	// The pool's own growth is not judged by its idle cache.
	press(holderPool, 500, holderPool, holderKV)
	f = p.figures()
	require.Equal(t, 2, f.Violations)
	require.Len(t, f.ViolationLog, 2)
	require.Contains(t, f.ViolationLog[0], "model-b was asked first while the activation pool held 1000 B")
	require.Contains(t, f.ViolationLog[1], "kv was asked while the activation pool's idle cache of 1000 B covered it")
}

func withLog(f pressureFigures) pressureFigures {
	if f.ViolationLog == nil {
		f.ViolationLog = []string{}
	}
	return f
}

// TestAuditCoversPool: the full audit checks the activation pool's ledger
// identity (its charge is its segments, cached + in use = segments) and
// that the holders' accounts, the pool's included, add up to the device
// mechanism's bytes; bytes charged to the pool's holder that the pool does
// not hold, or an activation held past its step, fail it. After Close the
// pool holds nothing and the device is free again.
func TestAuditCoversPool(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(t)
	cfg.Report = ""
	s, err := newStack(ctx, cfg, memreport.New(memreport.Options{}), nil)
	require.NoError(t, err)
	st, err := s.devDC.NewStream()
	require.NoError(t, err)
	e := &engine{cfg: cfg, s: s, out: &Outcome{}, stream: st, log: slog.New(slog.DiscardHandler)}
	audit := func(when string) []string {
		t.Helper()
		before := len(e.out.FailureLog)
		require.NoError(t, e.fullAudit(ctx, when))
		return e.out.FailureLog[before:]
	}
	require.Empty(t, audit("built"))

	// A step: its activations, freed behind its fence, stay cached.
	require.NoError(t, s.ws.alloc(ctx, 8, st))
	f, err := st.Record()
	require.NoError(t, err)
	require.NoError(t, s.ws.release(f))
	require.Empty(t, audit("after a step"))
	ps := s.ws.pool.Stats()
	require.NotZero(t, ps.Cached)
	require.Equal(t, ps.Segments, ps.Cached)
	require.Equal(t, 2, e.out.PoolAudits)

	// Bytes charged to the pool's holder that the pool does not hold.
	buf, err := s.ws.bind.Allocate(ctx, 64<<10)
	require.NoError(t, err)
	got := strings.Join(audit("stray buffer"), "\n")
	require.Contains(t, got, "the activation pool holds")
	require.Contains(t, got, "the holders account for")
	require.NoError(t, buf.Close())
	require.Empty(t, audit("stray buffer closed"))

	// An activation held past its step.
	require.NoError(t, s.ws.alloc(ctx, 2, st))
	require.Contains(t, strings.Join(audit("held"), "\n"), "of activations in use between steps")
	f, err = st.Record()
	require.NoError(t, err)
	require.NoError(t, s.ws.release(f))
	require.Empty(t, audit("released"))

	// Under pressure the governor takes the pool's cache first: a
	// reservation of the KV store's that only the cache can cover.
	a, _ := s.g.Authority(s.devAuth)
	cached := s.ws.pool.Stats().Cached
	require.NotZero(t, cached)
	kvBind, err := s.mgr.Bind(holderKV, "kv-cache", s.devKey)
	require.NoError(t, err)
	take, err := kvBind.Allocate(ctx, a.Free+cached/2/s.mgrGranularity()*s.mgrGranularity())
	require.NoError(t, err)
	after := s.ws.pool.Stats()
	require.Less(t, after.Cached, cached, "the pool gave its cache back")
	require.NotZero(t, after.Reclaims)
	require.NoError(t, take.Close())
	require.NoError(t, kvBind.Close())
	require.Empty(t, audit("after the reclaim"))
	for _, h := range s.g.Snapshot().Holders {
		for _, ha := range h.Authorities {
			if ha.Authority == s.devAuth && h.ID != holderPool {
				require.Zero(t, ha.Tickets, "%s was asked while the pool's cache covered the shortfall", h.ID)
			}
		}
	}

	require.NoError(t, st.Close())
	require.NoError(t, s.close(ctx))
	require.Zero(t, s.ws.pool.Stats().Segments)
	require.Zero(t, s.devMech.UsedBytes())
	snap := s.g.Snapshot()
	for _, a := range snap.Authorities {
		require.Equal(t, a.Capacity, a.Free, "%s after close", a.ID)
	}
	require.Equal(t, 7, e.out.PoolAudits, "every audit above checked the pool")
}

// TestWithoutWorkspace: --workspace=false runs without the pool, its
// holder and its summary lines.
func TestWithoutWorkspace(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Requests = 40
	cfg.Workspace = false
	var stdout, stderr bytes.Buffer
	o, _, err := demo(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err, stderr.String())
	require.Zero(t, o.Failures, "%q", o.FailureLog)
	require.Equal(t, o.Requests, o.Served+o.Rejected)
	require.Zero(t, o.PoolSteps)
	require.Zero(t, o.PoolPressure.PoolFirst)
	require.NotContains(t, stdout.String(), "caches first")
	require.NotContains(t, stdout.String(), "activation pool")
}

// gatedFence completes once its gate is opened and the real fence has.
type gatedFence struct {
	memapi.Fence
	gate chan struct{}
}

func (f gatedFence) Done() bool {
	select {
	case <-f.gate:
		return f.Fence.Done()
	default:
		return false
	}
}

func (f gatedFence) Wait(ctx context.Context) error {
	select {
	case <-f.gate:
		return f.Fence.Wait(ctx)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f gatedFence) Ready() <-chan struct{} { return nil }

// gatedStream records gated fences: the step's work "runs" until the
// test opens the gate.
type gatedStream struct {
	memapi.Stream
	gate chan struct{}
}

func (s gatedStream) Record() (memapi.Fence, error) {
	f, err := s.Stream.Record()
	if err != nil {
		return nil, err
	}
	return gatedFence{f, s.gate}, nil
}

// TestActivationsFreedBehindTheStepsFence: the activations go back to the
// pool behind the step's fence, so while the step's work runs they are
// pending, and pressure (a Trim here) cannot take their memory; once the
// fence completes they are plain cache and Trim gives all of it back.
func TestActivationsFreedBehindTheStepsFence(t *testing.T) {
	ctx := context.Background()
	cfg := tinyConfig(t)
	cfg.Report = ""
	s, err := newStack(ctx, cfg, memreport.New(memreport.Options{}), nil)
	require.NoError(t, err)
	real, err := s.devDC.NewStream()
	require.NoError(t, err)
	st := gatedStream{real, make(chan struct{})}
	require.NoError(t, s.ws.alloc(ctx, 8, st))
	f, err := st.Record()
	require.NoError(t, err)
	require.NoError(t, s.ws.release(f))
	ps := s.ws.pool.Stats()
	require.Zero(t, ps.InUse)
	require.NotZero(t, ps.Pending, "the step's activations wait for its fence")
	_, err = s.ws.pool.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, ps.Pending, s.ws.pool.Stats().Pending, "pressure does not take memory the step's work may still use")
	close(st.gate)
	require.NoError(t, f.Wait(ctx))
	_, err = s.ws.pool.Trim(ctx)
	require.NoError(t, err)
	ps = s.ws.pool.Stats()
	require.Zero(t, ps.Pending)
	require.Zero(t, ps.Segments, "once the fence completed, all of it was cache")
	require.NoError(t, real.Close())
	require.NoError(t, s.close(ctx))
}
