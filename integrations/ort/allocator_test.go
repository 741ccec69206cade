package ort

import (
	"errors"
	"maps"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pool"
)

func TestOneModelThroughMemgen(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	dir := filepath.Join(testData, "node", "test_add")
	s, err := newSession(filepath.Join(dir, "model.onnx"), true, 1)
	if err != nil {
		t.Fatal(err)
	}
	in := loadSet(t, dir, 0, "input", len(s.inputs))
	want := loadSet(t, dir, 0, "output", len(s.outputs))
	got, err := s.run(in)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if err := compare(got[i], want[i]); err != nil {
			t.Error(err)
		}
	}
	if r.alloc.Stats().Allocs == 0 {
		t.Error("no allocation went through the memgen allocator")
	}
	charged := r.audit(t, "session open")
	t.Logf("session open: %d bytes charged, stats %+v", charged, r.alloc.Stats())
	s.close()
	r.auditZero(t, "session closed")
}

// wantStats are the GetStats figures the allocator's state implies,
// computed from the pool's and the allocator's own counters (InUse: the
// pool's blocks in use less the front cache's, plus the reserved buffers).
func wantStats(a *Allocator) map[string]int64 {
	ps, st := a.Pool().Stats(), a.Stats()
	return map[string]int64{
		"Limit":              -1,
		"InUse":              int64(ps.InUse + st.ReservedBytes - st.FrontBytes), // the front's blocks are free
		"TotalAllocated":     int64(ps.Segments + st.ReservedBytes),
		"MaxInUse":           int64(st.PeakBytes),
		"NumAllocs":          int64(st.Allocs + st.Reserves),
		"NumReserves":        int64(st.Reserves),
		"NumArenaExtensions": int64(ps.SegmentAllocs),
		"NumArenaShrinkages": int64(ps.SegmentFrees),
		"MaxAllocSize":       int64(st.MaxAllocSize),
	}
}

func sameStats(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Errorf("%s: GetStats\n got %v\nwant %v", what, got, want)
	}
}

// TestAllocatorSlots calls Alloc, Reserve, Free and GetStats through the
// OrtAllocator function pointers, as ONNX Runtime does: small and large
// blocks come from the pool, a reserved block is a whole buffer of the
// binding, GetStats reports the figures under the BFC arena's keys, and the
// ledger is exact at every step.
func TestAllocatorSlots(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	a := r.alloc
	small, page, large := a.cAlloc(100), a.cAlloc(64<<10), a.cAlloc(3<<20+1)
	res := a.cReserve(1 << 20)
	for i, p := range []unsafe.Pointer{small, page, large, res} {
		if p == nil {
			t.Fatalf("allocation %d refused: %v", i, a.LastError())
		}
		if uintptr(p)%pool.Alignment != 0 {
			t.Errorf("allocation %d at %p is not %d-byte aligned", i, p, pool.Alignment)
		}
	}
	// The blocks are real memory, and disjoint.
	unsafe.Slice((*byte)(large), 3<<20+1)[3<<20] = 7
	unsafe.Slice((*byte)(res), 1<<20)[1<<20-1] = 9
	unsafe.Slice((*byte)(page), 64<<10)[0] = 5
	st := a.Stats()
	// 100 B rounds to the 256 B class, 64 KiB is a class, 3 MiB+1 rounds
	// to 256 B; the reserved MiB is a buffer of its own (page-rounded).
	inUse := int64(256 + 64<<10 + 3<<20 + 256 + 1<<20)
	if st.Allocs != 3 || st.Reserves != 1 || int64(st.LiveBytes) != inUse || st.ReservedBytes != 1<<20 || st.MaxAllocSize != 3<<20+1 {
		t.Errorf("stats %+v, want 3 allocs, 1 reserve, %d bytes live of which 1 MiB reserved", st, inUse)
	}
	charged := r.audit(t, "four blocks held")
	got, err := a.base().stats(false)
	if err != nil {
		t.Fatal(err)
	}
	want := wantStats(a)
	sameStats(t, "four blocks held", got, want)
	if got["InUse"] != inUse || got["TotalAllocated"] != int64(charged) || got["NumAllocs"] != 4 || got["NumReserves"] != 1 || got["NumArenaExtensions"] == 0 {
		t.Errorf("GetStats %v: want InUse %d, TotalAllocated %d (the holder's charge), NumAllocs 4, NumReserves 1, an arena extension", got, inUse, charged)
	}
	// OrtApi::AllocatorGetStats on the allocator itself calls the slot.
	viaAPI, err := a.base().stats(true)
	if err != nil {
		t.Fatal(err)
	}
	sameStats(t, "through OrtApi::AllocatorGetStats", viaAPI, want)

	// Bad input changes nothing: zero and absurd sizes (a zero-byte request
	// gets NULL, as OrtAllocator's contract says; an absurd one an
	// exception, NULL here), a foreign pointer (inside a block), a double
	// free.
	before := a.Stats()
	for _, c := range []struct {
		name string
		call func() unsafe.Pointer
	}{
		{"Alloc(0)", func() unsafe.Pointer { return a.cAlloc(0) }},
		{"Reserve(0)", func() unsafe.Pointer { return a.cReserve(0) }},
		{"Alloc(1<<50)", func() unsafe.Pointer { return a.cAlloc(1 << 50) }},
		{"Reserve(1<<50)", func() unsafe.Pointer { return a.cReserve(1 << 50) }},
	} {
		if p := c.call(); p != nil {
			t.Errorf("%s returned %p", c.name, p)
		}
		if err := a.LastError(); !errors.Is(err, memapi.ErrInvalidSize) {
			t.Errorf("%s: last error %v is not memapi.ErrInvalidSize", c.name, err)
		}
	}
	a.cFree(unsafe.Add(large, 256))
	if err := a.LastError(); !errors.Is(err, memapi.ErrForeignHandle) {
		t.Errorf("Free inside a block: last error %v is not memapi.ErrForeignHandle", err)
	}
	after := a.Stats()
	if after.Refused != before.Refused+4 || after.FreeErrors != before.FreeErrors+1 || after.Live != 4 || after.LiveBytes != before.LiveBytes || after.Allocs != before.Allocs || after.MaxAllocSize != before.MaxAllocSize {
		t.Errorf("bad input changed the allocator: before %+v, after %+v", before, after)
	}
	if n := r.audit(t, "after bad input"); n != charged {
		t.Errorf("bad input changed the charge from %d to %d", charged, n)
	}
	if err := a.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("Close with blocks held: %v, want memapi.ErrInUse", err)
	}
	for _, p := range []unsafe.Pointer{small, page, large, res} {
		a.cFree(p)
	}
	a.cFree(small) // double free
	if err := a.LastError(); !errors.Is(err, memapi.ErrForeignHandle) {
		t.Errorf("double Free: last error %v is not memapi.ErrForeignHandle", err)
	}
	if st := a.Stats(); st.Frees != 4 || st.FreeErrors != before.FreeErrors+2 || st.Live != 0 || st.LiveBytes != 0 {
		t.Errorf("after the frees: %+v", st)
	}
	r.audit(t, "all freed, cached")
	got, err = a.base().stats(false)
	if err != nil {
		t.Fatal(err)
	}
	sameStats(t, "all freed", got, wantStats(a))
	if got["InUse"] != 0 || got["MaxInUse"] != inUse {
		t.Errorf("all freed: GetStats %v, want InUse 0 and MaxInUse %d", got, inUse)
	}
	r.auditZero(t, "all freed")
	got, err = a.base().stats(false)
	if err != nil {
		t.Fatal(err)
	}
	sameStats(t, "cache trimmed", got, wantStats(a))
	if got["TotalAllocated"] != 0 || got["NumArenaShrinkages"] == 0 {
		t.Errorf("cache trimmed: GetStats %v, want TotalAllocated 0 and a shrinkage", got)
	}
}

// TestGetStatsThroughORT reads the allocator's statistics as ONNX Runtime
// itself sees them: the session's allocator wrapped by OrtApi::
// CreateAllocator, read with OrtApi::AllocatorGetStats, goes through ONNX
// Runtime's IAllocator wrapper of the registered allocator, which parses
// the keys GetStats returns into its AllocatorStats and prints them again.
// Every figure comes back as the allocator reports it. A session without
// env allocators reports its own BFC arena's figures under the same keys.
func TestGetStatsThroughORT(t *testing.T) {
	needSmall(t)
	r := newRig(t, 1<<30, Options{})
	s, err := newSession(smallModel, true, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if _, err := s.run([]tensor{mlpInput(256, 512)}); err != nil {
		t.Fatal(err)
	}
	r.audit(t, "after a run")
	o, err := s.allocator()
	if err != nil {
		t.Fatal(err)
	}
	got, err := o.stats(true)
	o.release()
	if err != nil {
		t.Fatal(err)
	}
	want := wantStats(r.alloc)
	sameStats(t, "the session's allocator through ONNX Runtime", got, want)
	if want["NumReserves"] == 0 || want["InUse"] == 0 {
		t.Errorf("figures %v: want reserves and bytes in use while the session is open", want)
	}

	def, err := newSession(smallModel, false, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer def.close()
	if _, err := def.run([]tensor{mlpInput(256, 512)}); err != nil {
		t.Fatal(err)
	}
	o, err = def.allocator()
	if err != nil {
		t.Fatal(err)
	}
	arena, err := o.stats(true)
	o.release()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ONNX Runtime's own arena: %v", arena)
	for _, k := range statKeys {
		if _, ok := arena[k]; !ok {
			t.Errorf("ONNX Runtime's arena reports no %s: %v", k, arena)
		}
	}
	if arena["NumArenaExtensions"] == 0 {
		t.Errorf("the default session's allocator is not an arena: %v", arena)
	}
}
