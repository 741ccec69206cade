//go:build memgentmpl

// memgen:needs DeviceAllocator.Allocate DeviceAllocator.Free DeviceAllocator.UsedBytes DeviceAllocator.Info ErrNotCommitted ErrInvalidRange

package conformance

import (
	"fmt"
	"time"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// Fixtures: each valid<Method> returns the arguments of one valid call of the
// method on e's mechanism. The generated subtests break one argument at a
// time and check the error the spec declares for it.

func (e *env) validAllocate(t T) *callAllocate {
	// One byte more than a granule: the call must round up.
	return &callAllocate{ctx: e.ctx, req: memapi.AllocRequest{Size: e.allocGran() + 1}, grant: e.grant}
}

func (e *env) validFree(t T) *callFree {
	t.Helper()
	return &callFree{ctx: e.ctx, a: e.allocate(t, e.allocGran()+1), to: e.account}
}

// Witnesses: for a method with one, invariant/no-silent-noop calls
// witness<Method>(t, c) before the valid call c and the function it returns
// after the call succeeded, with the handle the call made; it checks through
// the device context that the call really did its work. Every consuming
// method has one.

func (e *env) witnessAllocate(t T, c *callAllocate) func(memapi.Handle) {
	return func(h memapi.Handle) {
		t.Helper()
		a, _ := h.(*memapi.Allocation)
		if a == nil {
			t.Errorf("Allocate reported success with no Allocation")
			return
		}
		e.witnessed(t, "Allocate", a.Addr(), a.Size())
	}
}

func init() {
	da := memapi.Of(memapi.CapDeviceAllocator)
	scenarios = append(scenarios,
		test{"DeviceAllocator/Info/describes-instance", da, testInfoDescribesInstance},
		test{"DeviceAllocator/Allocate/round-trip", da, testAllocateRoundTrip},
		test{"DeviceAllocator/Allocate/disjoint", da, testAllocateDisjoint},
		test{"DeviceAllocator/UsedBytes/exact-with-rounding", da, testUsedBytesExactWithRounding},
		test{"DeviceContext/Device/matches-mechanism", da, testContextDevice},
		test{"DeviceContext/Record/fence-completes", da, testFenceCompletes},
		test{"DeviceContext/CopyDevice/round-trip", da, testCopyDevice},
		test{"DeviceContext/CopyToDevice/freed-memory-fails", da, testWriteFreedFails},
		test{"concurrency/DeviceAllocator", da, testConcurrentAllocator},
	)
}

func testInfoDescribesInstance(t T, e *env) {
	i := e.info
	if again := e.m.Info(); again != i {
		t.Errorf("Info changed between calls: %+v, then %+v", i, again)
	}
	if i.Instance == 0 {
		t.Errorf("Info().Instance is 0")
	}
	if i.Mechanism == "" {
		t.Errorf("Info().Mechanism is empty")
	}
	if i.Authority == "" {
		t.Errorf("Info().Authority is empty")
	}
	if i.AllocGranularity == 0 {
		t.Errorf("Info().AllocGranularity is 0")
	}
	if e.caps != memapi.Of(memapi.CapDeviceAllocator) && i.Granularity == 0 {
		t.Errorf("Info().Granularity is 0 but the mechanism offers %s", e.caps)
	}
	if o := e.other(t); o.info.Mechanism != i.Mechanism {
		t.Errorf("two instances from one factory name different mechanisms: %q and %q", i.Mechanism, o.info.Mechanism)
	}
}

func testAllocateRoundTrip(t T, e *env) {
	ag := e.allocGran()
	sizes := []memapi.Bytes{1, ag, ag + 1, 3*ag - 1}
	for i, size := range sizes {
		a := e.allocate(t, size)
		what := fmt.Sprintf("Allocate(%d)", size)
		if a.Size() < size {
			t.Errorf("%s: Size() is %d, smaller than asked", what, a.Size())
		}
		data := pattern(a.Size(), byte(i))
		e.write(t, what, a.Addr(), data)
		e.expectBytes(t, what+": reading back what was written", a.Addr(), data)
		// A write at an offset lands at that offset.
		if a.Size() > 1 {
			off := a.Size() / 2
			part := pattern(a.Size()-off, byte(i+100))
			e.write(t, what, a.Addr()+memapi.DeviceAddr(off), part)
			e.expectBytes(t, what+": first half after writing the second", a.Addr(), data[:off])
			e.expectBytes(t, what+": second half", a.Addr()+memapi.DeviceAddr(off), part)
		}
		e.free(t, a)
	}
}

func testAllocateDisjoint(t T, e *env) {
	ag := e.allocGran()
	var as []*memapi.Allocation
	var data [][]byte
	for i := range 3 {
		a := e.allocate(t, ag*memapi.Bytes(i+1))
		for j, b := range as {
			if overlap(a.Addr(), a.Size(), b.Addr(), b.Size()) {
				t.Errorf("allocation %d [%#x, +%#x) overlaps allocation %d [%#x, +%#x)", i, a.Addr(), a.Size(), j, b.Addr(), b.Size())
			}
		}
		as = append(as, a)
		d := pattern(a.Size(), byte(10*i+1))
		e.write(t, "Allocate", a.Addr(), d)
		data = append(data, d)
	}
	for i, a := range as {
		e.expectBytes(t, fmt.Sprintf("allocation %d after writing all of them", i), a.Addr(), data[i])
	}
	for _, a := range as {
		e.free(t, a)
	}
}

func overlap(a memapi.DeviceAddr, an memapi.Bytes, b memapi.DeviceAddr, bn memapi.Bytes) bool {
	return uint64(a) < uint64(b)+uint64(bn) && uint64(b) < uint64(a)+uint64(an)
}

func testUsedBytesExactWithRounding(t T, e *env) {
	ag := e.allocGran()
	sizes := []memapi.Bytes{1, ag, ag + 1, 2*ag + ag/2 + 1}
	var as []*memapi.Allocation
	want := e.start
	for _, size := range sizes {
		a := e.allocate(t, size)
		rounded := e.round(t, size, roundAlloc)
		if a.Size() != rounded {
			t.Errorf("Allocate(%d).Size() = %d, want %d (rounded up to the allocation granularity %d)", size, a.Size(), rounded, ag)
		}
		want += rounded
		if got := e.m.UsedBytes(); got != want {
			t.Errorf("after Allocate(%d): UsedBytes = %d, want %d", size, got, want)
		}
		as = append(as, a)
	}
	// Free in another order than allocated.
	for _, i := range []int{1, 3, 0, 2} {
		e.free(t, as[i])
		want -= as[i].Size()
		if got := e.m.UsedBytes(); got != want {
			t.Errorf("after freeing %v (%d bytes): UsedBytes = %d, want %d", as[i], as[i].Size(), got, want)
		}
	}
}

func testContextDevice(t T, e *env) {
	if got := e.dc.Device(); got != e.info.Device {
		t.Errorf("DeviceContext.Device() = %+v, the mechanism's Info().Device is %+v", got, e.info.Device)
	}
}

func testFenceCompletes(t T, e *env) {
	a := e.allocate(t, e.allocGran())
	s, err := e.dc.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	defer s.Close()
	data := pattern(a.Size(), 7)
	if err := s.CopyToDevice(a.Addr(), data); err != nil {
		t.Fatalf("CopyToDevice: %v", err)
	}
	f, err := s.Record()
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	if f == nil {
		t.Fatalf("Record returned no fence")
	}
	wctx, done := e.op("Fence.Wait", e.ctx)
	err = f.Wait(wctx)
	done()
	if err != nil {
		t.Fatalf("Fence.Wait: %v", err)
	}
	if !f.Done() {
		t.Errorf("Fence.Done() is false after Wait returned")
	}
	if ch := f.Ready(); ch != nil {
		select {
		case <-ch:
		case <-time.After(e.opTimeout):
			t.Errorf("Fence.Ready() channel not closed after Wait returned")
		}
	}
	// The work before the fence has run: its bytes are there.
	got := make([]byte, len(data))
	if err := s.CopyFromDevice(got, a.Addr()); err != nil {
		t.Fatalf("CopyFromDevice: %v", err)
	}
	f2, err := s.Record()
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	wctx, done = e.op("Fence.Wait", e.ctx)
	err = f2.Wait(wctx)
	done()
	if err != nil {
		t.Fatalf("Fence.Wait: %v", err)
	}
	if i := firstDiff(got, data); i >= 0 {
		t.Errorf("after the fence completed, byte %d read back is %#02x, want %#02x", i, got[i], data[i])
	}
	if err := s.Close(); err != nil {
		t.Errorf("Stream.Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Stream.Close (idempotent): %v", err)
	}
	e.free(t, a)
}

func testCopyDevice(t T, e *env) {
	size := e.allocGran()
	src, dst := e.allocate(t, size), e.allocate(t, size)
	data := pattern(size, 3)
	e.write(t, "source", src.Addr(), data)
	e.write(t, "destination", dst.Addr(), pattern(size, 4))
	s := e.sharedStream(t)
	if err := s.CopyDevice(dst.Addr(), src.Addr(), size); err != nil {
		t.Fatalf("CopyDevice: %v", err)
	}
	sctx, done := e.op("Stream.Synchronize", e.ctx)
	err := s.Synchronize(sctx)
	done()
	if err != nil {
		t.Fatalf("Synchronize after CopyDevice: %v", err)
	}
	e.expectBytes(t, "destination after CopyDevice", dst.Addr(), data)
	e.expectBytes(t, "source after CopyDevice", src.Addr(), data)
	e.free(t, src)
	e.free(t, dst)
}

func testWriteFreedFails(t T, e *env) {
	a := e.allocate(t, e.allocGran())
	addr, size := a.Addr(), a.Size()
	e.free(t, a)
	e.refuseWrite(t, "writing into freed memory", addr, pattern(size, 1), memapi.ErrNotCommitted, memapi.ErrInvalidRange)
}

func testConcurrentAllocator(t T, e *env) {
	ag := e.allocGran()
	parallel(t, 8, func(w int) error {
		s, err := e.dc.NewStream()
		if err != nil {
			return err
		}
		defer s.Close()
		for i := range 16 {
			size := ag*memapi.Bytes(1+(w+i)%3) + memapi.Bytes(i%2)
			a, err := (&callAllocate{ctx: e.ctx, req: memapi.AllocRequest{Size: size}, grant: e.grant}).do(e)
			if err != nil {
				return fmt.Errorf("Allocate(%d): %w", size, err)
			}
			data := pattern(a.Size(), byte(w*16+i))
			if err := e.writeOn(s, a.Addr(), data); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			got, err := e.readOn(s, a.Addr(), a.Size())
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if j := firstDiff(got, data); j >= 0 {
				return fmt.Errorf("allocation %v: byte %d changed under concurrent use", a, j)
			}
			if _, err := (&callFree{ctx: e.ctx, a: a, to: e.account}).call(e); err != nil {
				return fmt.Errorf("calling Free: %w", err)
			}
		}
		return nil
	})
}
