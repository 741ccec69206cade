package main

import (
	"context"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// host is the governed host device both modes run memgen on: a governor
// whose authority "host" the caller sizes (SetCapacity), the CPU mechanism
// at 4 KiB behind a device context, and a manager with the device
// registered.
type host struct {
	g   *governor.Governor
	mgr *pmm.Manager
	key memapi.DeviceKey
	// close releases the manager, the device context and the governor,
	// each bounded by 10 s.
	close func()
}

func newHost() (*host, error) {
	g := governor.New(governor.Options{})
	mech, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: "host"})
	if err != nil {
		g.Close()
		return nil, err
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	h := &host{g: g, mgr: mgr, key: memapi.DeviceKey{Kind: memapi.DeviceKindHost}, close: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = mgr.Close(ctx)
		_ = ectx.Close(ctx, true)
		_ = g.Close()
	}}
	if err := g.AddAuthority("host", 1<<40); err != nil {
		h.close()
		return nil, err
	}
	if err := mgr.Register(pmm.Device{Key: h.key, Mechanism: mech, Context: ectx, Authority: "host"}); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}
