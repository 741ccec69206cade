package ort

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// The decoder model scripts/ort.sh builds (decoder 4 256 4 2 4096 1024
// 1024): 4 layers, 2 KV heads of size 64, 4,096 rows, vocabulary 1,024.
var decoderModel = envOr("MEMGEN_ORT_DECODER_MODEL", cacheDir()+"/gqa-decoder-l4d256h4kv2s4096v1024.onnx")

const (
	decMaxSeq   = 4096
	decTensors  = 4 * 2 * 2 // layers × KV heads × {key, value}
	decRowBytes = 64 * 4
	kvGranule   = cpu.Granularity4KiB
)

func needDecoder(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(decoderModel); err != nil {
		t.Fatalf("%v: run `make ort` to build it", err)
	}
}

// kvHost is a governed host device for KV caches: the CPU mechanism with
// 4 KiB granules (16 cache rows of 256 bytes), holder "kv" (which frees
// nothing under pressure: a sequence's cache is data) bound to it.
type kvHost struct {
	g    *governor.Governor
	m    *cpu.Mechanism
	ectx *ep.Context
	mgr  *pmm.Manager
	bind *pmm.Binding
}

func newKVHost(t testing.TB, capacity memapi.Bytes) *kvHost {
	t.Helper()
	g := governor.New(governor.Options{})
	if err := g.AddAuthority(hostAuth, capacity); err != nil {
		t.Fatal(err)
	}
	m, err := cpu.New(cpu.Options{Granularity: kvGranule, Authority: hostAuth})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	mgr := pmm.New(pmm.GovernorLedger(g), pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: ectx, Authority: hostAuth}); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("kv", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	bind, err := mgr.Bind("kv", "kv-cache", host)
	if err != nil {
		t.Fatal(err)
	}
	h := &kvHost{g: g, m: m, ectx: ectx, mgr: mgr, bind: bind}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := ectx.Close(ctx, true); err != nil {
			t.Error(err)
		}
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return h
}

// charged drains the release queue and returns the authority's charge,
// failing the test unless the ledger is balanced with nothing pending or
// reserved and the mechanism's count and the kernel's (mincore) equal it.
func (h *kvHost) charged(t testing.TB, what string) memapi.Bytes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.ectx.Queue().Drain(ctx); err != nil {
		t.Fatalf("%s: drain: %v", what, err)
	}
	s, _ := h.g.Authority(hostAuth)
	used := h.m.UsedBytes()
	kern, err := h.m.KernelBytes()
	if err != nil {
		t.Fatal(err)
	}
	if !s.Balanced() || s.Pending != 0 || s.Reserved != 0 || s.Charged != used || used != kern {
		t.Fatalf("%s: ledger charged %d pending %d reserved %d (balanced %v), mechanism %d, kernel %d",
			what, s.Charged, s.Pending, s.Reserved, s.Balanced(), used, kern)
	}
	return s.Charged
}

// kvBytes is what a KVGrow sequence of tokens tokens holds: per cache
// tensor the rows times the row bytes, rounded up to the granule.
func kvBytes(tokens int) memapi.Bytes {
	per, _ := memapi.RoundUp(memapi.Bytes(tokens)*decRowBytes, kvGranule)
	return per * decTensors
}

func newDecoder(t testing.TB, bind *pmm.Binding, mode KVMode) *Decoder {
	t.Helper()
	needDecoder(t)
	d, err := NewDecoder(decoderModel, bind, DecoderOptions{Mode: mode, MaxSeq: decMaxSeq})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

func argmax(x []float32) int64 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int64(best)
}

func TestDecoderSmoke(t *testing.T) {
	h := newKVHost(t, 256<<20)
	grow := newDecoder(t, h.bind, KVGrow)
	cat := newDecoder(t, nil, KVConcat)
	ctx := context.Background()
	a, err := grow.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := cat.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ta, tb := int64(1), int64(1)
	for i := range 100 {
		la, err := a.Step(ctx, ta)
		if err != nil {
			t.Fatal(i, err)
		}
		lb, err := b.Step(ctx, tb)
		if err != nil {
			t.Fatal(i, err)
		}
		var md float64
		for k := range la {
			md = max(md, float64(abs32(la[k]-lb[k])))
		}
		ta, tb = argmax(la), argmax(lb)
		t.Logf("step %d: %d %d diff %g backed %d charged %d", i, ta, tb, md, a.Stats().Backed, h.charged(t, "x"))
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	t.Log(h.charged(t, "closed"))
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}
