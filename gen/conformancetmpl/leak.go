//go:build memgentmpl

// memgen:needs DeviceAllocator.Allocate DeviceAllocator.Free DeviceKindHost

package conformance

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// The leak check, for a subject whose memory the mechanism maps per
// allocation (Subject.HostMapped: a host-memory plugin): after Free returned,
// no page of the freed range may still be mapped. A Free that reports
// success and keeps the mapping passes every accounting check and still
// leaks the memory.

func init() {
	scenarios = append(scenarios, test{"leak/freed-range-unmapped", memapi.Of(memapi.CapDeviceAllocator), testFreedUnmapped})
}

func testFreedUnmapped(t T, e *env) {
	if !e.hostMapped {
		t.Skipf("the subject does not say its allocations are host mappings of their own (Subject.HostMapped)")
	}
	if e.info.Device.Kind != memapi.DeviceKindHost {
		t.Fatalf("Subject.HostMapped is set, but the mechanism serves %v memory", e.info.Device.Kind)
	}
	const n = 32
	// Every allocation is live before the first is freed, and nothing is
	// allocated between the frees and the check, so no freed range can have
	// been handed out again.
	var live []*memapi.Allocation
	for i := range n {
		a := e.allocate(t, e.allocGran()*memapi.Bytes(1+i%3))
		if mapped, ok := hostMapped(a.Addr(), a.Size()); ok && mapped == 0 {
			t.Fatalf("allocation %v is not mapped at all before Free: the check cannot tell", a)
		}
		live = append(live, a)
	}
	// Each range is checked right after its Free, with no allocation by
	// the suite in between (mincore allocates nothing).
	still, example := 0, ""
	for _, a := range live {
		addr, size := a.Addr(), a.Size()
		e.free(t, a)
		mapped, ok := hostMapped(addr, size)
		if !ok {
			t.Skipf("this platform cannot tell whether a range is mapped")
		}
		if mapped > 0 {
			still++
			example = fmt.Sprintf("%d of the %d bytes at %#x", mapped*os.Getpagesize(), size, addr)
		}
	}
	// Another thread of the process may map memory into a range just freed
	// (the Go runtime does), so one range still mapped proves nothing; a
	// Free that unmaps nothing leaves every range mapped.
	switch {
	case still > n/4:
		t.Errorf("%d of %d freed allocations are still mapped (%s): Free reported success without unmapping (a leak)", still, n, example)
	case still > 0:
		t.Logf("%d of %d freed ranges are mapped again (%s), by another thread of the process", still, n, example)
	}
}

// hostMapped reports how many pages of [addr, addr+n) of this process are
// mapped: mincore fails with ENOMEM for a page that is not, so each page is
// asked alone. ok is false when the kernel answers otherwise.
func hostMapped(addr memapi.DeviceAddr, n memapi.Bytes) (mapped int, ok bool) {
	page := uintptr(os.Getpagesize())
	var vec [1]byte
	for p := uintptr(addr) &^ (page - 1); p < uintptr(addr)+uintptr(n); p += page {
		_, _, errno := syscall.Syscall(syscall.SYS_MINCORE, p, page, uintptr(unsafe.Pointer(&vec[0])))
		switch errno {
		case 0:
			mapped++
		case syscall.ENOMEM:
		default:
			return 0, false
		}
	}
	return mapped, true
}
