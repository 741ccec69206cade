package pmm_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// A runtime integrator wires a governor, a mechanism and its device context
// into a manager, then gives each holder a binding.
func Example() {
	ctx := context.Background()
	g := governor.New(governor.Options{})
	defer g.Close()
	_ = g.AddAuthority("host", 64<<20)
	_ = g.Register("kv", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }), governor.HolderOptions{})

	m, _ := cpu.New(cpu.Options{Granularity: cpu.Granularity2MiB, Authority: "host"})
	dc := ep.NewContext(cpu.NewContext(m), ep.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	mgr := pmm.New(g, pmm.Options{})
	_ = mgr.Register(pmm.Device{Key: host, Mechanism: m, Context: dc, Authority: "host"})

	kv, _ := mgr.Bind("kv", "kv-cache", host)
	region, _ := kv.ReserveVirtual(ctx, 32<<20) // addresses only
	var tokens memapi.Bytes
	_ = region.Grow(ctx, 3<<20, func(n memapi.Bytes) error { tokens = n; return nil })
	a, _ := g.Authority("host")
	fmt.Printf("view %d bytes, backed %d MiB, charged %d MiB\n", tokens, region.Len()>>20, a.Charged>>20)

	_ = region.Close() // released behind its fences
	// Close waits for the deferred free, and for every buffer still open:
	// bound it, so a leaked handle makes it fail (memapi.ErrInUse) instead
	// of waiting for ever. (memgentest does this teardown in tests.)
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = dc.Close(closeCtx, true)
	a, _ = g.Authority("host")
	fmt.Printf("charged %d, free %d MiB\n", a.Charged, a.Free>>20)
	// Output:
	// view 3145728 bytes, backed 4 MiB, charged 4 MiB
	// charged 0, free 64 MiB
}

// Without VirtualBacking, ReserveVirtual says so; the caller chooses its
// explicit fallback.
func ExampleBinding_ReserveVirtual_unsupported() {
	err := fmt.Errorf("pmm.ReserveVirtual: %w", memapi.ErrUnsupported)
	if errors.Is(err, errors.ErrUnsupported) {
		fmt.Println("fall back to Allocate of the maximum")
	}
	// Output: fall back to Allocate of the maximum
}
