package pmm_test

import (
	"context"
	"encoding/csv"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

// request is one LLM request of the workload: prompt and generated tokens.
type request struct{ prompt, gen int }

// tracePath is the production trace, relative to this package (CI has
// shared/ beside the repository too).
var tracePath = filepath.Join("..", "..", "shared", "traces", "azure-llm-conv-2023.csv")

// loadTrace reads the first n requests of the Azure LLM conversation trace
// (Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0), or returns nil when the
// file is absent.
func loadTrace(t *testing.T, n int) []request {
	f, err := os.Open(tracePath)
	if err != nil {
		return nil
	}
	defer f.Close()
	r := csv.NewReader(f)
	if _, err := r.Read(); err != nil {
		t.Fatalf("trace header: %v", err)
	}
	var out []request
	for len(out) < n {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		p, err1 := strconv.Atoi(rec[1])
		g, err2 := strconv.Atoi(rec[2])
		require.NoError(t, errors.Join(err1, err2))
		out = append(out, request{p, g})
	}
	return out
}

// generated is the fallback workload: the trace's rough shape, seeded.
func generated(n int) []request {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([]request, n)
	for i := range out {
		out[i] = request{prompt: 400 + rng.IntN(2600), gen: 5 + rng.IntN(300)}
	}
	return out
}

// coldCache is a reference holder that keeps buffers it can drop: under a
// pressure ticket it closes the oldest until the ticket is covered (the
// refund arrives once the queue really freed them).
type coldCache struct {
	mu   sync.Mutex
	bufs []*pmm.Buffer
}

func (c *coldCache) Reclaim(_ context.Context, t governor.Ticket) (memapi.Bytes, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var freed memapi.Bytes
	for freed < t.Wanted && len(c.bufs) > 0 {
		b := c.bufs[0]
		c.bufs = c.bufs[1:]
		freed += b.Size()
		if err := b.Close(); err != nil {
			return freed, err
		}
	}
	return freed, nil
}

func (c *coldCache) closeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.bufs {
		_ = b.Close()
	}
	c.bufs = nil
}

// kvRequest is a reference KV holder's request: a region holding the shared
// system prompt read-only, then the request's own tokens.
type kvRequest struct {
	r      *pmm.Region
	prefix memapi.Bytes
	tokens int // the holder's view: tokens whose KV is backed
	left   int
}

const (
	bytesPerToken = 2 * 4 * 2 * 64 * 2 // 2 (K,V) x 4 layers x 2 kv heads x 64 dims x fp16
	hostAuth      = memapi.AuthorityID("host")
	capacity      = 96 << 20
)

func TestIntegrationCPUGovernorTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	reqs := loadTrace(t, 240)
	if reqs == nil {
		t.Logf("trace %s absent: using a generated workload of the same shape", tracePath)
		reqs = generated(240)
	}

	g := governor.New(governor.Options{})
	defer g.Close()
	require.NoError(t, g.AddAuthority(hostAuth, capacity))
	m, err := cpu.New(cpu.Options{Granularity: 4096, Authority: hostAuth})
	require.NoError(t, err)
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	mgr := pmm.New(g, pmm.Options{Verify: true})
	require.NoError(t, mgr.Register(pmm.Device{Key: memapi.DeviceKey{Kind: memapi.DeviceKindHost}, Mechanism: m, Context: ectx, Authority: hostAuth}))
	dev := memapi.DeviceKey{Kind: memapi.DeviceKindHost}

	cold := &coldCache{}
	require.NoError(t, g.Register("cold", cold, governor.HolderOptions{Priority: 0}))
	require.NoError(t, g.Register("kv", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }), governor.HolderOptions{Priority: 10}))
	coldB, err := mgr.Bind("cold", "cache", dev, pmm.WithPriority(0))
	require.NoError(t, err)
	kvB, err := mgr.Bind("kv", "kv-cache", dev, pmm.WithPriority(10))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Pressure source: a second holder fills 60% of the budget with cold data.
	for i := 0; i < 48; i++ {
		b, err := coldB.Allocate(ctx, 1<<20)
		require.NoError(t, err)
		cold.mu.Lock()
		cold.bufs = append(cold.bufs, b)
		cold.mu.Unlock()
	}

	audit := func(when string) {
		t.Helper()
		require.NoError(t, ectx.Queue().Drain(ctx))
		a, ok := g.Authority(hostAuth)
		require.True(t, ok)
		require.True(t, a.Balanced(), "%s: ledger identity broken: %+v", when, a)
		kernel, err := m.KernelBytes()
		require.NoError(t, err)
		require.Equal(t, a.Charged+a.Pending, m.UsedBytes(), "%s: ledger vs mechanism", when)
		require.Equal(t, m.UsedBytes(), kernel, "%s: mechanism vs kernel", when)
	}
	audit("start")

	// The shared system prompt: 100 tokens, charged once, mapped read-only.
	prefixTokens := 100
	prefix, err := kvB.CreateShared(ctx, memapi.Bytes(prefixTokens*bytesPerToken))
	require.NoError(t, err)

	const batch = 24
	maxLive := 0
	for start := 0; start < len(reqs); start += batch {
		var live []*kvRequest
		for _, q := range reqs[start:min(start+batch, len(reqs))] {
			max := prefix.Size() + memapi.Bytes((q.prompt+q.gen)*bytesPerToken)
			r, err := kvB.ReserveVirtual(ctx, max)
			require.NoError(t, err)
			_, err = r.MapShared(ctx, prefix, memapi.AccessReadOnly)
			require.NoError(t, err)
			kr := &kvRequest{r: r, prefix: prefix.Size(), left: q.gen}
			// Admission: the prompt's KV.
			require.NoError(t, r.Grow(ctx, kr.prefix+memapi.Bytes(q.prompt*bytesPerToken), func(n memapi.Bytes) error {
				kr.tokens = int((n - kr.prefix) / bytesPerToken)
				return nil
			}))
			live = append(live, kr)
		}
		maxLive = max(maxLive, len(live))
		// Decode: one token per request per step, growing in granules.
		for step := 0; len(live) > 0; step++ {
			next := live[:0]
			for _, kr := range live {
				want := kr.prefix + memapi.Bytes((kr.tokens+1)*bytesPerToken)
				require.NoError(t, kr.r.Grow(ctx, want, func(n memapi.Bytes) error {
					kr.tokens = int((n - kr.prefix) / bytesPerToken)
					return nil
				}))
				kr.left--
				if kr.left > 0 {
					next = append(next, kr)
					continue
				}
				require.NoError(t, kr.r.Close())
			}
			live = next
			if step%64 == 0 {
				audit("decode")
			}
		}
		audit("batch done")
	}
	snap := g.Snapshot()
	a, _ := g.Authority(hostAuth)
	t.Logf("%d requests, up to %d concurrent; tickets %d, freed by holders %d bytes, pressure events %d",
		len(reqs), maxLive, a.Tickets, a.Freed, a.PressureEvents)
	require.NotZero(t, a.Tickets, "the workload should have put the cold holder under pressure")
	_ = snap

	require.NoError(t, prefix.Close())
	cold.closeAll()
	audit("end")
	require.NoError(t, coldB.Close())
	require.NoError(t, kvB.Close())
	watchdog.Within(t, watchdog.Bound, "the device context's Close", func() { require.NoError(t, ectx.Close(ctx, true)) })
	a, _ = g.Authority(hostAuth)
	require.Equal(t, memapi.Bytes(capacity), a.Free, "every byte returned")
	require.Zero(t, m.UsedBytes())
}
