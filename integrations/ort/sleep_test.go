package ort

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// offloadTier adds the host tier to h: a second CPU mechanism on an
// authority of its own, and a binding of the holder "sleep" there.
func (h *kvHost) offloadTier(t *testing.T) (*pmm.Binding, *cpu.Mechanism) {
	t.Helper()
	const tier = memapi.AuthorityID("offload")
	if err := h.g.AddAuthority(tier, 1<<30); err != nil {
		t.Fatal(err)
	}
	m, err := cpu.New(cpu.Options{Authority: tier})
	if err != nil {
		t.Fatal(err)
	}
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	key := memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}
	if err := h.mgr.Register(pmm.Device{Key: key, Mechanism: m, Context: ectx, Authority: tier}); err != nil {
		t.Fatal(err)
	}
	if err := h.g.Register("sleep", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := h.mgr.Bind("sleep", "host-copy", key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := errors.Join(b.Close(), ectx.Close(ctx, true)); err != nil {
			t.Error(err)
		}
	})
	return b, m
}

// A sequence put to sleep in the middle of its decode gives its KV cache
// back to the device (it waits in the host tier), refuses steps, and after
// Wake decodes on with the logits of an uninterrupted sequence, bit for
// bit; both tiers' ledgers equal their mechanisms' bytes and the kernel's.
func TestSequenceSleepWake(t *testing.T) {
	needExported(t)
	h := newKVHost(t, 256<<20)
	host, tierMech := h.offloadTier(t)
	d, err := NewDecoder(genaiMaskModel, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	twin, err := d.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer twin.Close()
	q, err := d.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	prompt := make([]int64, 40)
	for i := range prompt {
		prompt[i] = int64(i*37+5) % int64(d.Vocab())
	}
	next := func(s *Sequence, tok int64, prefill []int64) int64 {
		t.Helper()
		var l []float32
		var err error
		if prefill != nil {
			l, err = s.Prefill(ctx, prefill)
		} else {
			l, err = s.Step(ctx, tok)
		}
		if err != nil {
			t.Fatal(err)
		}
		best := 0
		for i, v := range l {
			if v > l[best] {
				best = i
			}
		}
		return int64(best)
	}
	a, b := next(twin, 0, prompt), next(q, 0, prompt)
	for range 10 {
		a, b = next(twin, a, nil), next(q, b, nil)
	}
	before := h.charged(t, "before the sleep")
	kv := q.Stats().Backed
	if err := q.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	if got := h.charged(t, "asleep"); got != before-kv || q.Stats().Backed != kv {
		t.Fatalf("asleep: the device holds %d, want %d less its KV %d", got, before, kv)
	}
	if k, _ := tierMech.KernelBytes(); k != kv || tierMech.UsedBytes() != kv {
		t.Fatalf("the host tier holds %d (kernel %d), want the KV's %d", tierMech.UsedBytes(), k, kv)
	}
	if _, err := q.Step(ctx, b); !errors.Is(err, ErrAsleep) || !q.Asleep() {
		t.Fatalf("a step while asleep: %v", err)
	}
	if err := q.Sleep(ctx, host); err != nil {
		t.Fatalf("a second sleep: %v", err)
	}
	if err := q.Wake(ctx); err != nil {
		t.Fatal(err)
	}
	if got := h.charged(t, "awake"); got != before || tierMech.UsedBytes() != 0 || q.Asleep() {
		t.Fatalf("awake: the device holds %d, want %d; the host tier %d", got, before, tierMech.UsedBytes())
	}
	for range 20 {
		la, err := twin.Step(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		la = append([]float32(nil), la...)
		lb, err := q.Step(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		for i := range la {
			if math.Float32bits(la[i]) != math.Float32bits(lb[i]) {
				t.Fatalf("logit %d after the sleep: %v, uninterrupted %v", i, lb[i], la[i])
			}
		}
		a, b = next(twin, a, nil), next(q, b, nil)
	}
	// Asleep at Close: the host copies go with it.
	if err := q.Sleep(ctx, host); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	h.charged(t, "closed asleep")
	if tierMech.UsedBytes() != 0 {
		t.Fatalf("the host tier holds %d after the close", tierMech.UsedBytes())
	}
}

func TestSequenceSleepRefusals(t *testing.T) {
	needExported(t)
	h := newKVHost(t, 256<<20)
	host, _ := h.offloadTier(t)
	ctx := context.Background()
	pre, err := NewDecoder(genaiMaskModel, h.bind, DecoderOptions{Mode: KVPreallocated, MaxSeq: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Close()
	q, err := pre.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := q.Sleep(ctx, host); !errors.Is(err, memapi.ErrUnsupported) {
		t.Fatalf("a preallocated sequence's sleep: %v", err)
	}
	d, err := NewDecoder(genaiMaskModel, h.bind, DecoderOptions{Mode: KVGrow, MaxSeq: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	g, err := d.NewSequence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Step(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := g.Sleep(ctx, nil); !errors.Is(err, memapi.ErrNilHandle) {
		t.Fatalf("no host binding: %v", err)
	}
	if err := g.Sleep(ctx, h.bind); !errors.Is(err, memapi.ErrInvalidRange) || g.Asleep() {
		t.Fatalf("a host binding on the cache's own authority: %v (asleep %v)", err, g.Asleep())
	}
	if _, err := g.Step(ctx, 2); err != nil {
		t.Fatalf("a step after the refused sleep: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if err := g.Sleep(ctx, host); !errors.Is(err, memapi.ErrClosed) {
		t.Fatalf("a closed sequence's sleep: %v", err)
	}
}
