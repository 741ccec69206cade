package pmm_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// benchEnv is the real stack: CPU mechanism, governor, deferred-free queue.
type benchEnv struct {
	g    *governor.Governor
	m    *cpu.Mechanism
	ectx *ep.Context
	mgr  *pmm.Manager
	b    *pmm.Binding
}

func newBenchEnv(b *testing.B, gran memapi.Bytes, inject memapi.Injector) *benchEnv {
	m, err := cpu.New(cpu.Options{Granularity: gran, Authority: hostAuth})
	if err != nil {
		b.Fatal(err)
	}
	e := newBenchEnvOn(b, m, cpu.NewContext(m), inject)
	e.m = m
	return e
}

// newBenchEnvOn is the stack over mechanism m and its context.
func newBenchEnvOn(b *testing.B, m memapi.Mechanism, mctx memapi.DeviceContext, inject memapi.Injector, opts ...pmm.Options) *benchEnv {
	g := governor.New(governor.Options{Injector: inject})
	if err := g.AddAuthority(hostAuth, 8<<30); err != nil {
		b.Fatal(err)
	}
	if err := g.Register("bench", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }), governor.HolderOptions{}); err != nil {
		b.Fatal(err)
	}
	ectx := ep.NewContext(mctx, ep.Options{})
	var o pmm.Options
	if len(opts) > 0 {
		o = opts[0]
	}
	mgr := pmm.New(g, o)
	dev := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: dev, Mechanism: m, Context: ectx, Authority: hostAuth}); err != nil {
		b.Fatal(err)
	}
	bind, err := mgr.Bind("bench", "buffers", dev)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := ectx.Close(context.Background(), true); err != nil {
			b.Error(err)
		}
		g.Close()
	})
	return &benchEnv{g: g, ectx: ectx, mgr: mgr, b: bind}
}

// bareGrant lets the bare mechanism be called: mechanisms never draw.
type bareGrant struct{}

func (bareGrant) Authority() memapi.AuthorityID { return hostAuth }
func (bareGrant) Draw(memapi.Bytes) error       { return nil }
func (bareGrant) Undraw(memapi.Bytes) error     { return nil }
func (bareGrant) Refund(memapi.Bytes) error     { return nil }

// BenchmarkAllocateClose: a governed Allocate+Close (grant, checked
// allocation, lease, owning handle, deferred free, refund) against the bare
// mechanism's Allocate+Free, alternating in one run, at three sizes, over
// the CPU mechanism (mmap and munmap: what a real caller pays) and over the
// fake mechanism (a map: where the governor's and the manager's share
// shows).
func BenchmarkAllocateClose(b *testing.B) {
	for _, mech := range []string{"cpu", "fake"} {
		for _, size := range []memapi.Bytes{4 << 10, 64 << 10, 2 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", mech, size>>10), func(b *testing.B) {
				var m memapi.DeviceAllocator
				var e *benchEnv
				if mech == "cpu" {
					e = newBenchEnv(b, 4096, nil)
					m = e.m
				} else {
					fm := fakes.NewMechanism(fakes.Config{Authority: hostAuth})
					e = newBenchEnvOn(b, fm, fakes.NewContext(fm), nil)
					m = fm
				}
				benchAllocateClose(b, e, m, size)
			})
		}
	}
}

func benchAllocateClose(b *testing.B, e *benchEnv, m memapi.DeviceAllocator, size memapi.Bytes) {
	ctx := context.Background()
	var bare, governed time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		a, err := m.Allocate(ctx, memapi.AllocRequest{Size: size}, bareGrant{})
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Free(ctx, a, bareGrant{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		buf, err := e.b.Allocate(ctx, size)
		if err != nil {
			b.Fatal(err)
		}
		if err := buf.Close(); err != nil {
			b.Fatal(err)
		}
		if err := e.ectx.Queue().Drain(ctx); err != nil { // the free and refund really happened
			b.Fatal(err)
		}
		t2 := time.Now()
		bare += t1.Sub(t0)
		governed += t2.Sub(t1)
	}
	b.ReportMetric(float64(bare.Nanoseconds())/float64(b.N), "bare-ns/op")
	b.ReportMetric(float64(governed.Nanoseconds())/float64(b.N), "governed-ns/op")
	b.ReportMetric(float64(governed)/float64(bare), "x-vs-bare")
}

// BenchmarkGrow: one Grow transaction of a granule (grant, checked commit,
// holder callback, lease) against the bare Commit of the same range.
func BenchmarkGrow(b *testing.B) {
	const gran = 64 << 10
	const steps = 64
	e := newBenchEnv(b, gran, nil)
	ctx := context.Background()
	vb, _ := e.m.AsVirtualBacking()
	res, err := vb.Reserve(ctx, memapi.ReserveRequest{Size: steps * gran})
	if err != nil {
		b.Fatal(err)
	}
	defer vb.ReleaseReservation(ctx, res, bareGrant{})
	r, err := e.b.ReserveVirtual(ctx, steps*gran)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var tokens memapi.Bytes
	update := func(n memapi.Bytes) error { tokens = n; return nil }
	defer func() { _ = tokens }()
	var bare, governed time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := memapi.Bytes(i % steps)
		if k == 0 && i > 0 {
			b.StopTimer()
			if err := vb.Decommit(ctx, res, memapi.Range{Off: 0, Len: steps * gran}, bareGrant{}); err != nil {
				b.Fatal(err)
			}
			if err := r.Shrink(ctx, 0, update); err != nil {
				b.Fatal(err)
			}
			if err := e.ectx.Queue().Drain(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		t0 := time.Now()
		if err := vb.Commit(ctx, res, memapi.Range{Off: k * gran, Len: gran}, bareGrant{}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := r.Grow(ctx, (k+1)*gran, update); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		bare += t1.Sub(t0)
		governed += t2.Sub(t1)
	}
	b.ReportMetric(float64(bare.Nanoseconds())/float64(b.N), "bare-ns/op")
	b.ReportMetric(float64(governed.Nanoseconds())/float64(b.N), "grow-ns/op")
	b.ReportMetric(float64(governed)/float64(bare), "x-vs-bare")
}

// manualFence completes when the benchmark says, and remembers when.
type manualFence struct {
	ch chan struct{}
	at time.Time
}

func (f *manualFence) Done() bool {
	select {
	case <-f.ch:
		return true
	default:
		return false
	}
}
func (f *manualFence) Wait(ctx context.Context) error {
	select {
	case <-f.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (f *manualFence) Ready() <-chan struct{} { return f.ch }

// refundClock is an injector that injects nothing: it timestamps the
// lease refunds as they begin.
type refundClock struct{ last atomic.Int64 }

func (r *refundClock) MaybeError(op memapi.Op) error {
	if op.String() == "governor.Lease.Refund" {
		r.last.Store(time.Now().UnixNano())
	}
	return nil
}

// BenchmarkFenceToRefund: the latency from a fence completing to the lease
// refund, through the deferred-free queue and the CPU mechanism's free.
func BenchmarkFenceToRefund(b *testing.B) {
	rc := &refundClock{}
	e := newBenchEnv(b, 4096, rc)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf, err := e.b.Allocate(ctx, 64<<10)
		if err != nil {
			b.Fatal(err)
		}
		f := &manualFence{ch: make(chan struct{})}
		if err := buf.RecordUse(f); err != nil {
			b.Fatal(err)
		}
		if err := buf.Close(); err != nil {
			b.Fatal(err)
		}
		f.at = time.Now()
		close(f.ch)
		if err := e.ectx.Queue().Drain(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Duration(rc.last.Load()-f.at.UnixNano()))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}
