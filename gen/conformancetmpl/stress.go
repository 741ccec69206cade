//go:build memgentmpl

// memgen:needs DeviceAllocator.Allocate DeviceAllocator.Free DeviceAllocator.UsedBytes

package conformance

import (
	"fmt"
	"sync"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// The stress: StressWorkers goroutines allocate, use and free StressRounds
// times each, all at once, on one instance. A mechanism whose handle table
// is not synchronized loses or mixes up entries under it: a Free of a live
// allocation fails, two live allocations overlap, or UsedBytes ends off.

// StressWorkers and StressRounds size concurrency/stress.
const (
	StressWorkers = 8
	StressRounds  = 300
)

func init() {
	scenarios = append(scenarios, test{"concurrency/stress", memapi.Of(memapi.CapDeviceAllocator), testStress})
}

func testStress(t T, e *env) {
	ag := e.allocGran()
	var mu sync.Mutex
	live := map[memapi.DeviceAddr]int{} // start address -> worker, of the live allocations
	parallel(t, StressWorkers, func(w int) error {
		s, err := e.dc.NewStream()
		if err != nil {
			return err
		}
		defer s.Close()
		for i := range StressRounds {
			a, err := (&callAllocate{ctx: e.ctx, req: memapi.AllocRequest{Size: ag}, grant: e.grant}).do(e)
			if err != nil {
				return fmt.Errorf("round %d: Allocate(%d): %w", i, ag, err)
			}
			mu.Lock()
			other, dup := live[a.Addr()]
			live[a.Addr()] = w
			mu.Unlock()
			if dup {
				return fmt.Errorf("round %d: Allocate returned %#x, which worker %d holds live", i, a.Addr(), other)
			}
			if i%32 == 0 {
				data := pattern(a.Size(), byte(w*31+i))
				if err := e.writeOn(s, a.Addr(), data); err != nil {
					return fmt.Errorf("round %d: write: %w", i, err)
				}
				got, err := e.readOn(s, a.Addr(), a.Size())
				if err != nil {
					return fmt.Errorf("round %d: read: %w", i, err)
				}
				if j := firstDiff(got, data); j >= 0 {
					return fmt.Errorf("round %d: allocation %v: byte %d changed under concurrent use", i, a, j)
				}
			}
			_ = e.m.UsedBytes()
			mu.Lock()
			delete(live, a.Addr())
			mu.Unlock()
			if _, err := (&callFree{ctx: e.ctx, a: a, to: e.account}).call(e); err != nil {
				return fmt.Errorf("round %d: Free of a live allocation: %w", i, err)
			}
		}
		return nil
	})
	if used := e.m.UsedBytes(); used != e.start {
		t.Errorf("after %d×%d allocations and frees UsedBytes is %d, want %d", StressWorkers, StressRounds, used, e.start)
	}
}
