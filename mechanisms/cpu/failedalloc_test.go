package cpu

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// vmSize is the process's mapped address space (VmSize), in bytes.
func vmSize(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmSize:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmSize in /proc/self/status")
	return 0
}

// TestFailedAllocateUnmapsItsRange: an Allocate whose populate fails
// unmaps the range it mapped: the process's address space is what it was
// (read from the kernel, VmSize), not 256 MiB more. The layout check
// of TestInjectedFaultAtEveryKernelCall sees the reservations' ranges
// only; this range is nobody's once the call failed.
func TestFailedAllocateUnmapsItsRange(t *testing.T) {
	const size = 256 << 20 // far above what the runtime maps meanwhile
	var set memapi.FaultSet
	m := newMechWith(t, Options{Granularity: fgran, Faults: &set})
	rule := memapi.Fail(unix.EIO).On(Layer, "madvise").When(func(op memapi.Op) bool { return op.Args == "DeviceAllocator.Allocate" })
	set.Add(rule)
	before := vmSize(t)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: size}, g)
	after := vmSize(t)
	if a != nil || err == nil || rule.Fired() != 1 {
		t.Fatalf("Allocate with its populate failed: %v, %v (fired %d)", a, err, rule.Fired())
	}
	if after > before+size/2 {
		t.Fatalf("the failed Allocate left its range mapped: VmSize %d -> %d bytes", before, after)
	}
	checkKernel(t, m)
}
