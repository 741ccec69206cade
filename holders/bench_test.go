package holders_test

import (
	"context"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/pmm"
)

// BenchmarkKVAppend measures a decode step (one token appended) through the
// KV store against the same growth done directly on a pmm.Region, in the
// same run and alternately, on the CPU mechanism with the real governor. The
// ratio is the store's overhead: its bookkeeping, the cancellable context
// and the request's state checks.
func BenchmarkKVAppend(b *testing.B) {
	const maxTokens = 2048
	r := newCPURig(b, 1<<30, 1<<30)
	ctx := context.Background()
	shape := holders.ModelShape{Layers: 4, KVHeads: 2, HeadDim: 64, DTypeBytes: 2} // 2 KiB: 32 tokens per 64 KiB chunk
	kv, err := holders.NewKVStore(holders.KVConfig{Manager: r.mgr, Device: devKey, Shape: shape})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.g.Register("kv", kv, governor.HolderOptions{}); err != nil {
		b.Fatal(err)
	}
	bind, err := r.mgr.Bind("raw", "kv", devKey)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.g.Register("raw", nil, governor.HolderOptions{}); err != nil {
		b.Fatal(err)
	}
	bpt := shape.BytesPerToken()

	var req *holders.Request
	var region *pmm.Region
	var tokens int
	restart := func() {
		if req != nil {
			if err := req.Finish(); err != nil {
				b.Fatal(err)
			}
			if err := region.Close(); err != nil {
				b.Fatal(err)
			}
			// The releases run now, not under either side's clock.
			if err := r.devCtx.Queue().Drain(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if req, err = kv.Admit(ctx, holders.RequestSpec{ID: "r", MaxTokens: maxTokens}); err != nil {
			b.Fatal(err)
		}
		if region, err = bind.ReserveVirtual(ctx, maxTokens*bpt); err != nil {
			b.Fatal(err)
		}
		tokens = 0
	}
	restart()
	var store, raw time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if tokens == maxTokens {
			b.StopTimer()
			restart()
			b.StartTimer()
		}
		t0 := time.Now()
		if err := req.Append(ctx, 1); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		n := tokens + 1
		if err := region.Grow(ctx, memapi.Bytes(n)*bpt, func(memapi.Bytes) error { tokens = n; return nil }); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		store += t1.Sub(t0)
		raw += t2.Sub(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(store.Nanoseconds())/float64(b.N), "ns/store-append")
	b.ReportMetric(float64(raw.Nanoseconds())/float64(b.N), "ns/region-grow")
	b.ReportMetric(float64(store)/float64(raw), "x-vs-region")
	if err := req.Finish(); err != nil {
		b.Fatal(err)
	}
	if err := region.Close(); err != nil {
		b.Fatal(err)
	}
	if err := kv.Close(); err != nil {
		b.Fatal(err)
	}
	if err := bind.Close(); err != nil {
		b.Fatal(err)
	}
}
