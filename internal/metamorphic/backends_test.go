package metamorphic

import (
	"fmt"
	"os"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/mechanisms/cuda"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// The configuration the three share.
const (
	// gran is the granularity of VirtualBacking and SharedMapping: one the
	// CPU mechanism accepts (a power-of-two multiple of the page), the fakes
	// take in their Config and the simulator reports as its VMM granularity.
	gran memapi.Bytes = 64 << 10
	// capacity is the physical memory of the fakes (Config.Capacity) and of
	// the simulated device (cudasim.Config.Memory). The CPU mechanism has no
	// capacity of its own: see apply.
	capacity = 32 * gran
	// hugeSize is beyond every mechanism's largest object (the fakes' 2^48,
	// the CPU's 2^47, the device's memory): refused before anything is asked
	// of the kernel or the driver.
	hugeSize memapi.Bytes = 1 << 50
	// grantLimit is the budget of every backend's grant: draws accumulate
	// over a sequence (refunds go to the account), and a huge size must
	// reach the mechanism rather than stop at the grant.
	grantLimit memapi.Bytes = 1 << 62
)

// pageSize is the allocation granularity of all three: the CPU mechanism's
// is the page, and the fakes and the CUDA mechanism (and the simulator's
// cuMemAlloc) are configured with it.
var pageSize = memapi.Bytes(os.Getpagesize())

// The backends, in the order results are printed.
const (
	fakeB = iota
	cpuB
	cudaB
	nBackends
)

var backendNames = [nBackends]string{"fakes", "cpu", "cuda"}

// backend is one implementation under test: the checked wrapper over it, its
// capabilities through the wrapper, the grant consuming calls draw from and
// the account refunding calls refund to (both of the fakes' trusted ledger),
// the bare mechanism for fault injection and the final checks, and (the CPU
// mechanism's) the faults it is built with.
type backend struct {
	name    string
	m       memapi.Mechanism // the checked wrapper
	vb      memapi.VirtualBacking
	sm      memapi.SharedMapping
	grant   *fakes.Grant
	account *fakes.Account

	fake   *fakes.Mechanism // fakeB
	cpu    *cpu.Mechanism   // cpuB
	faults *memapi.FaultSet // cpuB: Options.Faults
	cuda   *cuda.Mechanism  // cudaB
	sim    *cudasim.Sim     // cudaB
}

func wrap(name string, m memapi.Mechanism) *backend {
	w := checked.Wrap(m, fakes.Ledger)
	auth := w.Info().Authority
	b := &backend{
		name:    name,
		m:       w,
		grant:   fakes.NewGrant(auth, grantLimit),
		account: fakes.NewAccount(auth),
	}
	b.vb, _ = w.AsVirtualBacking()
	b.sm, _ = w.AsSharedMapping()
	return b
}

// newBackends builds the three. The CUDA mechanism keeps no pool of
// pre-created handles and no spares, so that the simulated device's memory is
// exactly what UsedBytes counts and runs out where the fakes' capacity does.
func newBackends() ([nBackends]*backend, error) {
	var bs [nBackends]*backend
	f := fakes.NewMechanism(fakes.Config{
		AllocGranularity: pageSize,
		Granularity:      gran,
		Capacity:         capacity,
		Quiet:            true,
	})
	bs[fakeB] = wrap(backendNames[fakeB], f)
	bs[fakeB].fake = f

	faults := &memapi.FaultSet{}
	c, err := cpu.New(cpu.Options{Granularity: gran, NoHugePages: true, Faults: faults})
	if err != nil {
		return bs, fmt.Errorf("cpu.New: %w", err)
	}
	bs[cpuB] = wrap(backendNames[cpuB], c)
	bs[cpuB].cpu, bs[cpuB].faults = c, faults

	sim := cudasim.New(cudasim.Config{
		Memory:      uint64(capacity),
		Granularity: uint64(gran),
		AllocPage:   uint64(pageSize),
	})
	g, err := cuda.New(cuda.Config{
		Driver:           sim.Table(),
		AllocGranularity: pageSize,
		PoolChunks:       -1,
		SpareChunks:      -1,
	})
	if err != nil {
		return bs, fmt.Errorf("cuda.New: %w", err)
	}
	bs[cudaB] = wrap(backendNames[cudaB], g)
	bs[cudaB].cuda, bs[cudaB].sim = g, sim

	for _, b := range bs {
		in := b.m.Info()
		if in.Granularity != gran || in.AllocGranularity != pageSize {
			return bs, fmt.Errorf("%s: granularity %d, allocation granularity %d; want %d and %d",
				b.name, in.Granularity, in.AllocGranularity, gran, pageSize)
		}
	}
	return bs, nil
}
