package main

import (
	"context"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
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
	// limit is the shared ledger's capacity (nil without a ledger): the
	// most the authority can grow to (llamacpp.Options.Limit).
	limit func() memapi.Bytes
	// ledger is the shared ledger joined (nil without one): the engine's
	// moves to and from the host tier are noted in its slot (tierNotes).
	ledger *xproc.Ledger
	// close releases the manager, the device contexts and the governor,
	// each bounded by 10 s.
	close func()
	// offload is the host tier an idle engine sleeps into: a second CPU
	// mechanism on an authority of its own ("offload"), outside the
	// device's budget and any shared ledger.
	offload memapi.DeviceKey
}

// newHost makes the host; with ledger set, its authority "host" is bound
// to that shared ledger (xproc): its capacity is what this process claims
// from the ledger, and the other processes on the ledger share it.
func newHost(ledger string) (*host, error) {
	g := governor.New(governor.Options{})
	mech, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: "host"})
	if err != nil {
		g.Close()
		return nil, err
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	tier, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: "offload"})
	if err != nil {
		g.Close()
		return nil, err
	}
	tierCtx := ep.NewContext(cpu.NewContext(tier), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	var l *xproc.Ledger
	h := &host{g: g, mgr: mgr, key: memapi.DeviceKey{Kind: memapi.DeviceKindHost}, offload: memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: 1}, close: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = mgr.Close(ctx)
		_ = ectx.Close(ctx, true)
		_ = tierCtx.Close(ctx, true)
		if l != nil {
			_ = l.CloseContext(ctx)
		}
		_ = g.Close()
	}}
	if ledger == "" {
		if err := g.AddAuthority("host", 1<<40); err != nil {
			h.close()
			return nil, err
		}
	} else {
		var err error
		if l, err = xproc.Open(ledger, xproc.Options{}); err != nil {
			h.close()
			return nil, err
		}
		if err := l.Bind(g, "host"); err != nil {
			h.close()
			return nil, err
		}
		h.ledger = l
		h.limit = func() memapi.Bytes {
			st, _, err := l.State()
			if err != nil {
				return 0
			}
			return memapi.Bytes(st.Capacity)
		}
	}
	if err := mgr.Register(pmm.Device{Key: h.key, Mechanism: mech, Context: ectx, Authority: "host"}); err != nil {
		h.close()
		return nil, err
	}
	if err := g.AddAuthority("offload", 1<<40); err != nil {
		h.close()
		return nil, err
	}
	if err := mgr.Register(pmm.Device{Key: h.offload, Mechanism: tier, Context: tierCtx, Authority: "offload"}); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}
