package ort_test

import (
	"context"
	"fmt"

	ortgo "github.com/yalue/onnxruntime_go"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/integrations/ort"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// A Go program gives ONNX Runtime a governed allocator: a binding for the
// holder that owns the session's memory, an Allocator over it registered
// with the environment (registered as that holder: its caches, the front
// cache in C and the pool's, are what the governor asks first under
// pressure), and sessions created with
// ort.SessionOptions. (The
// program calls ort.Init(libPath, ort.InitOptions{}) once at start; this
// package's TestMain did.) testdata/double_relu.onnx computes
// y = relu(2x).
func Example() {
	ctx := context.Background()
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("host", 256<<20)
	m, _ := cpu.New(cpu.Options{Authority: "host"})
	dc := ep.NewContext(cpu.NewContext(m), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	_ = mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: dc, Authority: "host"})
	bind, _ := mgr.Bind("onnx", "session", host)

	alloc, err := ort.NewAllocator(bind, ort.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = g.Register("onnx", alloc, governor.HolderOptions{Cache: true})
	opts, _ := ort.SessionOptions() // session.use_env_allocators = 1
	s, err := ortgo.NewDynamicAdvancedSession("testdata/double_relu.onnx", []string{"x"}, []string{"y"}, opts)
	_ = opts.Destroy()
	if err != nil {
		fmt.Println(err)
		return
	}
	x, _ := ortgo.NewTensor(ortgo.NewShape(1, 4), []float32{-1, 0.5, 2, -3})
	out := []ortgo.Value{nil} // ONNX Runtime allocates y through memgen
	if err := s.Run([]ortgo.Value{x}, out); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("y =", out[0].(*ortgo.Tensor[float32]).GetData())
	fmt.Println("allocated through memgen:", alloc.Stats().Allocs > 0)

	_ = out[0].Destroy()
	_ = x.Destroy()
	_ = s.Destroy()
	a, _ := g.Authority("host")
	fmt.Println("cached after the session:", a.Charged == alloc.CachedBytes("host") && a.Charged > 0)
	fmt.Println(alloc.Close()) // the front and the pool give their blocks and segments back
	_ = dc.Queue().Drain(ctx)  // releases are deferred; wait for the refunds
	a, _ = g.Authority("host")
	fmt.Println("charged after Close:", a.Charged)
	fmt.Println(dc.Close(ctx, true))
	// Output:
	// y = [0 1 4 0]
	// allocated through memgen: true
	// cached after the session: true
	// <nil>
	// charged after Close: 0
	// <nil>
}
