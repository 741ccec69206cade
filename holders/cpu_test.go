package holders_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
	"github.com/stretchr/testify/require"
)

// cpuRig is the real thing: two CPU mechanisms (a "device" and the host) on
// separate authorities, the real governor, the manager.
type cpuRig struct {
	g               *governor.Governor
	mgr             *pmm.Manager
	devM, hostM     *cpu.Mechanism
	devDC, hostDC   *cpu.Context
	devCtx, hostCtx *ep.Context
}

const (
	cpuDev  = memapi.AuthorityID("device")
	cpuHost = memapi.AuthorityID("host")
)

func newCPURig(t testing.TB, devCap, hostCap memapi.Bytes) *cpuRig {
	t.Helper()
	g := governor.New(governor.Options{})
	require.NoError(t, g.AddAuthority(cpuDev, devCap))
	require.NoError(t, g.AddAuthority(cpuHost, hostCap))
	devM, err := cpu.New(cpu.Options{Granularity: 64 << 10, Authority: cpuDev, Ordinal: 0})
	require.NoError(t, err)
	hostM, err := cpu.New(cpu.Options{Granularity: 64 << 10, Authority: cpuHost, Ordinal: 1})
	require.NoError(t, err)
	r := &cpuRig{g: g, devM: devM, hostM: hostM, devDC: cpu.NewContext(devM), hostDC: cpu.NewContext(hostM)}
	r.devCtx = ep.NewContext(r.devDC, ep.Options{})
	r.hostCtx = ep.NewContext(r.hostDC, ep.Options{})
	r.mgr = pmm.New(g, pmm.Options{Verify: true})
	require.NoError(t, r.mgr.Register(pmm.Device{Key: devKey, Mechanism: devM, Context: r.devCtx, Authority: cpuDev}))
	require.NoError(t, r.mgr.Register(pmm.Device{Key: hostKey, Mechanism: hostM, Context: r.hostCtx, Authority: cpuHost}))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := errors.Join(r.devCtx.Close(ctx, true), r.hostCtx.Close(ctx, true), g.Close()); err != nil {
			t.Error(err)
		}
	})
	return r
}

// audit checks at a quiescent point, per authority: the ledger is balanced,
// charged + pending equals the mechanism's bytes, and those equal what the
// kernel reports resident.
func (r *cpuRig) audit(t *testing.T, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, r.devCtx.Queue().Drain(ctx))
	require.NoError(t, r.hostCtx.Queue().Drain(ctx))
	for _, c := range []struct {
		auth memapi.AuthorityID
		m    *cpu.Mechanism
	}{{cpuDev, r.devM}, {cpuHost, r.hostM}} {
		a, ok := r.g.Authority(c.auth)
		require.True(t, ok)
		require.True(t, a.Balanced(), "%s: %s ledger unbalanced: %+v", when, c.auth, a)
		require.Equal(t, a.Charged+a.Pending, c.m.UsedBytes(), "%s: %s ledger vs mechanism", when, c.auth)
		kernel, err := c.m.KernelBytes()
		require.NoError(t, err)
		require.Equal(t, c.m.UsedBytes(), kernel, "%s: %s mechanism vs kernel", when, c.auth)
	}
}

// On the CPU mechanism with the real governor: KV growth puts the weights
// under pressure (cold weights are offloaded to the host, pinned ones stay),
// reloading weights in use puts the KV store under pressure (requests are
// preempted and requeued), both run concurrently, the ledger matches the
// mechanisms and the kernel at every quiescent point, every weight's bytes
// survive, and everything returns to zero.
func TestCPUHoldersUnderRealGovernor(t *testing.T) {
	const (
		mib     = memapi.Bytes(1 << 20)
		weightN = 8
		weightB = 2 * mib
	)
	r := newCPURig(t, 24*mib, 64*mib)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	res, err := holders.NewResidency(holders.ResidencyConfig{Manager: r.mgr, Device: devKey, DeviceContext: r.devDC,
		Host: hostKey, HostContext: r.hostDC, Staging: 512 << 10})
	require.NoError(t, err)
	require.NoError(t, r.g.Register(governor.HolderID(res.Holder()), res, governor.HolderOptions{Priority: 0}))
	kvShape := holders.ModelShape{Layers: 4, KVHeads: 2, HeadDim: 64, DTypeBytes: 2} // 2 KiB per token: 32 per chunk
	kv, err := holders.NewKVStore(holders.KVConfig{Manager: r.mgr, Device: devKey, Shape: kvShape, Context: r.devDC, Priority: 10})
	require.NoError(t, err)
	require.NoError(t, r.g.Register(governor.HolderID(kv.Holder()), kv, governor.HolderOptions{Priority: 10}))

	// 16 MiB of weights, the first two pinned (embeddings, always needed).
	data := map[string][]byte{}
	names := make([]string, weightN)
	for i := range names {
		names[i] = fmt.Sprintf("layer%d", i)
		data[names[i]] = randomBytes(uint64(i), int(weightB))
		require.NoError(t, res.Load(ctx, holders.WeightSpec{Name: names[i], Data: data[names[i]], Pinned: i < 2}))
	}
	r.audit(t, "weights loaded")

	// A shared system prompt, then requests that grow past what is left:
	// KV pressure offloads cold weights.
	sys := bytes.Repeat([]byte{0x5a}, 100*int(kv.BytesPerToken()))
	prefix, err := kv.NewPrefix(ctx, 100, sys)
	require.NoError(t, err)
	var reqs []*holders.Request
	for i := range 12 {
		q, err := kv.Admit(ctx, holders.RequestSpec{ID: fmt.Sprint("r", i), PromptTokens: 200, MaxTokens: 1200, Prefix: prefix, Priority: i % 3})
		require.NoError(t, err)
		reqs = append(reqs, q)
	}
	for step := range 300 {
		for _, q := range reqs {
			require.NoError(t, q.Append(ctx, 1), "step %d", step)
		}
	}
	st := res.Stats()
	require.NotZero(t, st.Offloads, "KV growth should have offloaded cold weights")
	for _, w := range res.Weights() {
		if w.Pinned {
			require.True(t, w.Resident, "pinned weight %s was offloaded", w.Name)
		}
	}
	r.audit(t, "after KV growth")

	// One request writes into the shared prompt: a real copy-on-write.
	q0 := reqs[0]
	require.NoError(t, q0.PrepareWrite(ctx, q0.TokenOffset(10), kvShape.BytesPerToken()))
	s0, err := r.devDC.NewStream()
	require.NoError(t, err)
	require.NoError(t, s0.CopyToDevice(q0.Addr()+memapi.DeviceAddr(q0.TokenOffset(10)), []byte("private")))
	require.NoError(t, s0.Synchronize(ctx))
	require.NoError(t, s0.Close())
	require.Equal(t, sys, read(t, r.devDC, reqs[1].Addr(), len(sys)), "the others still share the original")

	// Weights in use while reloading: the residency store cannot give
	// memory, so the KV store is asked and preempts requests.
	var uses []*holders.WeightUse
	for _, name := range names {
		u, err := res.Use(ctx, name)
		require.NoError(t, err)
		require.Equal(t, data[name], read(t, r.devDC, u.Addr, int(weightB)), name)
		uses = append(uses, u)
	}
	kst := kv.Stats()
	require.NotZero(t, kst.Preempted, "reloading weights in use should have preempted requests")
	require.Len(t, kv.Requeued(), int(kst.Preempted))
	for _, u := range uses {
		u.Done()
	}
	r.audit(t, "after reloads")

	// Both at once: a decoder goroutine steps, finishes and resumes
	// requests; a model goroutine uses weights in turn.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { // decoder
		defer wg.Done()
		for step := 0; step < 200 && errs[0] == nil; step++ {
			for _, q := range reqs {
				switch q.State() {
				case holders.Running:
					if q.Tokens() >= q.Spec().MaxTokens-1 {
						if err := q.Finish(); err != nil {
							errs[0] = err
						}
						continue
					}
					if err := q.Append(ctx, 1); err != nil && !errors.Is(err, holders.ErrPreempted) {
						errs[0] = err
					}
				case holders.Preempted:
					rctx, c := context.WithTimeout(ctx, 5*time.Millisecond)
					// No room before the short deadline is an expected answer.
					if err := kv.Resume(rctx, q); err != nil && !errors.Is(err, memapi.ErrOverBudget) && !errors.Is(err, context.DeadlineExceeded) {
						errs[0] = err
					}
					c()
				}
			}
		}
	}()
	go func() { // model
		defer wg.Done()
		for i := 0; i < 60 && errs[1] == nil; i++ {
			name := names[i%weightN]
			u, err := res.Use(ctx, name)
			if err != nil {
				errs[1] = err
				return
			}
			s, err := r.devDC.NewStream()
			if err == nil {
				got := make([]byte, weightB)
				err = s.CopyFromDevice(got, u.Addr)
				if err == nil {
					var f memapi.Fence
					if f, err = s.Record(); err == nil {
						err = u.RecordUse(f) // in flight until the read ran
					}
				}
				err = errors.Join(err, s.Synchronize(ctx), s.Close())
				if err == nil && !bytes.Equal(got, data[name]) {
					err = fmt.Errorf("weight %s changed", name)
				}
			}
			u.Done()
			errs[1] = err
		}
	}()
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	r.audit(t, "after concurrent run")
	t.Logf("residency %+v", res.Stats())
	t.Logf("kv %+v", kv.Stats())

	require.NoError(t, kv.Close())
	require.NoError(t, res.Close())
	r.audit(t, "end")
	require.Zero(t, r.devM.UsedBytes())
	require.Zero(t, r.hostM.UsedBytes())
	for _, auth := range []memapi.AuthorityID{cpuDev, cpuHost} {
		a, _ := r.g.Authority(auth)
		require.Equal(t, a.Capacity, a.Free, "%s: every byte returned", auth)
	}
	require.NoError(t, r.g.Unregister("kv"))
	require.NoError(t, r.g.Unregister("weights"))
}
