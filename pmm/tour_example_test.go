package pmm_test

import (
	"context"
	"fmt"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// The README's short tour, as it is printed there (the lines between the
// markers; TestReadmeTourIsTheExample in the module's root keeps the two
// the same), run with its figures.
func Example_tour() {
	// tour begins
	ctx := context.Background()
	g := governor.New(governor.Options{}) // the ledger
	g.AddAuthority("host", 64<<20)
	kvHolder := governor.HolderFunc(func(ctx context.Context, t governor.Ticket) (memapi.Bytes, error) {
		return 0, nil // asked to give t.Wanted back: the holder chooses what
	})
	g.Register("kv", kvHolder, governor.HolderOptions{})

	m, _ := cpu.New(cpu.Options{Authority: "host"}) // a mechanism: real mmap/memfd memory
	cc := cpu.NewContext(m)                         // its device context: streams and fences
	dc := ep.NewContext(cc, ep.Options{})           // with the deferred-free queue
	mgr := pmm.New(g, pmm.Options{})                // the ProcessMemoryManager, drawing from g
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: dc, Authority: "host"})

	kv, _ := mgr.Bind("kv", "kv-cache", host)  // a scoped MemoryBinding
	region, _ := kv.ReserveVirtual(ctx, 1<<30) // addresses only; ErrUnsupported without VirtualBacking
	var view memapi.Bytes                      // your view of the region's length
	region.Grow(ctx, 3<<20, func(n memapi.Bytes) error { view = n; return nil })
	// grant -> commit -> your view -> charge, or nothing at all
	stream, _ := cc.NewStream()
	stream.CopyToDevice(region.Addr(), []byte("tokens")) // device work that writes it
	fence, _ := stream.Record()
	region.RecordUse(fence) // its release waits for the work
	region.Close()          // freed after the fence, refunded after the free

	// Under the manager, or by hand: one way to reserve, the ctx bounding the wait.
	grant, _ := g.Reserve(ctx, governor.Request{Authority: "host", Holder: "kv", Role: "pages", Bytes: 2 << 20})
	grant.Cancel()
	// tour ends

	fmt.Printf("view %d MiB\n", view>>20)
	_ = stream.Close()
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = dc.Close(closeCtx, true) // the deferred frees ran
	a, _ := g.Authority("host")
	fmt.Printf("charged %d, reserved %d, free %d MiB\n", a.Charged, a.Reserved, a.Free>>20)
	g.Close()
	// Output:
	// view 3 MiB
	// charged 0, reserved 0, free 64 MiB
}
