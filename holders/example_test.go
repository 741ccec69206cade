package holders_test

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// device registers a CPU mechanism as a device accounted to auth.
func device(g *governor.Governor, mgr *pmm.Manager, key memapi.DeviceKey, auth memapi.AuthorityID, capacity memapi.Bytes) (*cpu.Mechanism, *ep.Context) {
	if err := g.AddAuthority(auth, capacity); err != nil {
		panic(err)
	}
	m, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: auth, Ordinal: key.Ordinal})
	if err != nil {
		panic(err)
	}
	ectx := ep.NewContext(cpu.NewContext(m), ep.Options{})
	if err := mgr.Register(pmm.Device{Key: key, Mechanism: m, Context: ectx, Authority: auth}); err != nil {
		panic(err)
	}
	return m, ectx
}

// A KV store on a 64 KiB budget: requests share a system prompt read-only,
// grow by one token per decode step, and when a request needs a chunk the
// budget lacks, the governor's ticket preempts the lowest-priority idle
// request, which is requeued for later.
func ExampleKVStore() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := governor.New(governor.Options{})
	defer g.Close()
	mgr := pmm.New(g, pmm.Options{Verify: true})
	key := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	m, ectx := device(g, mgr, key, "device", 64<<10)
	defer ectx.Close(ctx, true)

	// 2 x 2 layers x 2 kv heads x 64 dims x fp16 = 1 KiB per token.
	kv, err := holders.NewKVStore(holders.KVConfig{Manager: mgr, Device: key, Context: ectx.Device(),
		Shape:     holders.ModelShape{Layers: 2, KVHeads: 2, HeadDim: 64, DTypeBytes: 2},
		OnPreempt: func(r *holders.Request) { fmt.Println("preempted", r.Spec().ID, "with", r.Tokens(), "tokens") }})
	if err != nil {
		panic(err)
	}
	if err := g.Register("kv", kv, governor.HolderOptions{}); err != nil { // KVConfig.Holder's default
		panic(err)
	}
	prompt, _ := kv.NewPrefix(ctx, 8, bytes.Repeat([]byte{1}, 8<<10)) // 8 tokens: two 4 KiB chunks, charged once
	low, _ := kv.Admit(ctx, holders.RequestSpec{ID: "low", PromptTokens: 20, MaxTokens: 64, Priority: 0, Prefix: prompt})
	high, _ := kv.Admit(ctx, holders.RequestSpec{ID: "high", PromptTokens: 20, MaxTokens: 64, Priority: 1, Prefix: prompt})
	_ = ectx.Queue().Drain(ctx) // the view that wrote the prompt is released
	fmt.Println("used", m.UsedBytes()>>10, "KiB of 64, the prompt's", prompt.Size>>10, "KiB once")

	for range 20 { // decode: one token per step; a chunk every 4 tokens
		if err := high.Append(ctx, 1); err != nil {
			panic(err)
		}
	}
	fmt.Println("high has", high.Tokens(), "tokens; low is preempted:", low.State() == holders.Preempted)

	_ = high.Finish()
	if err := kv.Resume(ctx, low); err != nil {
		panic(err)
	}
	fmt.Println("low resumed with", low.Tokens(), "tokens; running:", low.State() == holders.Running)
	_ = kv.Close()
	_ = ectx.Queue().Drain(ctx)
	fmt.Println("used at the end:", m.UsedBytes())
	// Output:
	// used 48 KiB of 64, the prompt's 8 KiB once
	// preempted low with 20 tokens
	// high has 40 tokens; low is preempted: true
	// low resumed with 20 tokens; running: true
	// used at the end: 0
}

// A residency store with a device that fits two weights: loading a third
// offloads the coldest to host memory; using it again reloads it, bytes
// intact.
func ExampleResidency() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := governor.New(governor.Options{})
	defer g.Close()
	mgr := pmm.New(g, pmm.Options{Verify: true})
	devKey := memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 0}
	hostKey := memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}
	_, dctx := device(g, mgr, devKey, "device", 2<<20)
	defer dctx.Close(ctx, true)
	_, hctx := device(g, mgr, hostKey, "host", 64<<20)
	defer hctx.Close(ctx, true)

	res, err := holders.NewResidency(holders.ResidencyConfig{Manager: mgr,
		Device: devKey, DeviceContext: dctx.Device(), Host: hostKey, HostContext: hctx.Device()})
	if err != nil {
		panic(err)
	}
	if err := g.Register("weights", res, governor.HolderOptions{}); err != nil { // ResidencyConfig.Holder's default
		panic(err)
	}
	w := func(b byte) []byte { return bytes.Repeat([]byte{b}, 1<<20) }
	for i, name := range []string{"embed", "layer0", "layer1"} {
		if err := res.Load(ctx, holders.WeightSpec{Name: name, Data: w(byte(i + 1)), Pinned: name == "embed"}); err != nil {
			panic(err)
		}
	}
	for _, wi := range res.Weights() {
		fmt.Println(wi.Name, "resident:", wi.Resident)
	}
	u, err := res.Use(ctx, "layer0") // reloads layer0, offloading layer1
	if err != nil {
		panic(err)
	}
	s, _ := dctx.Device().NewStream()
	got := make([]byte, 1<<20)
	_ = s.CopyFromDevice(got, u.Addr)
	_ = s.Synchronize(ctx)
	_ = s.Close()
	u.Done()
	st := res.Stats()
	fmt.Println("bytes intact:", bytes.Equal(got, w(2)), "offloads:", st.Offloads, "reloads:", st.Reloads)
	_ = res.Close()
	// Output:
	// embed resident: true
	// layer0 resident: false
	// layer1 resident: true
	// bytes intact: true offloads: 2 reloads: 1
}
