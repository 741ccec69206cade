package ort

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pool"
)

// TestFrontClassesMatchPool: for every request size up to pool.SmallMax
// the front bins the block in the class the pool rounds the request to (the
// front takes the pool's table, pool.Classes, and never repeats its
// formula); 0 and larger sizes have no class (they go to Go).
func TestFrontClassesMatchPool(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	p := r.alloc.Pool()
	ctx := context.Background()
	for n := 1; n <= pool.SmallMax; n++ {
		blk, err := p.Alloc(ctx, memapi.Bytes(n), nil)
		if err != nil {
			t.Fatal(err)
		}
		want := uint64(blk.Rounded())
		if err := blk.Free(); err != nil {
			t.Fatal(err)
		}
		if got := r.alloc.frontClassSize(n); got != want {
			t.Fatalf("a request of %d bytes: the front's class is %d bytes, the pool rounds it to %d", n, got, want)
		}
	}
	for _, n := range []int{0, pool.SmallMax + 1, 1 << 30} {
		if got := r.alloc.frontClassSize(n); got != 0 {
			t.Errorf("a request of %d bytes has the front's class %d, want none", n, got)
		}
	}
}

// TestFrontHit: a Free the front keeps and the Alloc of its class it then
// serves never reach Go: the pool sees neither (its allocs and frees
// unchanged), the allocator counts both. A front-cached block is free to
// ONNX Runtime's view (Live, LiveBytes, GetStats' InUse) and in use to the
// pool's; CachedBytes counts it. A second Free of it is ErrForeignHandle
// and changes nothing.
func TestFrontHit(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	a := r.alloc
	const first, second, class = 50000, 57000, 57344 // both in the 56 KiB class
	p := a.cAlloc(first)
	if p == nil {
		t.Fatal(a.LastError())
	}
	a.cFree(p)
	st, ps := a.Stats(), a.Pool().Stats()
	if st.FrontKept != 1 || st.FrontBlocks != 1 || st.FrontBytes != class || st.Live != 0 || st.LiveBytes != 0 || st.Frees != 1 {
		t.Fatalf("after one Free: %+v, want it kept by the front", st)
	}
	if ps.InUse != class || ps.Frees != 0 {
		t.Errorf("the pool sees %d bytes in use and %d frees, want the front's block in use and no free", ps.InUse, ps.Frees)
	}
	if got, want := a.CachedBytes(hostAuth), ps.Cached+class; got != want {
		t.Errorf("CachedBytes %d, want the pool's %d plus the front's %d", got, ps.Cached, class)
	}
	if a.CachedBytes("elsewhere") != 0 {
		t.Error("CachedBytes on another authority is not 0")
	}
	if gs, err := a.base().stats(false); err != nil || gs["InUse"] != 0 {
		t.Errorf("GetStats %v (%v): InUse should not count the front's block", gs, err)
	}
	sameStats(t, "front-cached", mustStats(t, a), wantStats(a))
	charged := r.audit(t, "one block in the front")

	q := a.cAlloc(second)
	if q != p {
		t.Fatalf("Alloc(%d) = %p, want the front's block %p", second, q, p)
	}
	st2, ps2 := a.Stats(), a.Pool().Stats()
	if st2.Allocs != st.Allocs+1 || st2.FrontHits != 1 || st2.Live != 1 || st2.LiveBytes != class || st2.FrontBlocks != 0 || st2.MaxAllocSize != second || st2.PeakBytes != class {
		t.Errorf("after the hit: %+v", st2)
	}
	if ps2.Allocs != ps.Allocs || ps2.Frees != ps.Frees || ps2.InUse != ps.InUse {
		t.Errorf("the hit reached the pool: allocs %d -> %d, frees %d -> %d", ps.Allocs, ps2.Allocs, ps.Frees, ps2.Frees)
	}
	if gs, err := a.base().stats(false); err != nil || gs["InUse"] != class || gs["NumAllocs"] != 2 {
		t.Errorf("GetStats %v (%v): want InUse %d and 2 allocations", gs, err, class)
	}
	a.cFree(q)

	// A double free of a front-cached block.
	before := a.Stats()
	a.cFree(q)
	if err := a.LastError(); !errors.Is(err, memapi.ErrForeignHandle) {
		t.Errorf("a double Free of a front-cached block: last error %v, want memapi.ErrForeignHandle", err)
	}
	after := a.Stats()
	before.FreeErrors++
	if after != before {
		t.Errorf("the double Free changed the allocator:\nbefore %+v\nafter  %+v", before, after)
	}
	if n := r.audit(t, "after the double free"); n != charged {
		t.Errorf("the double Free changed the charge from %d to %d", charged, n)
	}
	// The block is still cached once: the next two Allocs of its class
	// get two different blocks.
	x, y := a.cAlloc(class), a.cAlloc(class)
	if x != p || y == nil || y == x {
		t.Errorf("after the double Free: %p and %p, want %p then another block", x, y, p)
	}
	a.cFree(x)
	a.cFree(y)
	r.auditZero(t, "all freed")
}

func mustStats(t *testing.T, a *Allocator) map[string]int64 {
	t.Helper()
	s, err := a.base().stats(false)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFrontBounds: the front keeps at most FrontDepth blocks per class and
// FrontBytes in all; a Free past either goes to Go (the pool's free). A
// negative FrontBytes turns the front off.
func TestFrontBounds(t *testing.T) {
	r := newRig(t, 1<<30, Options{FrontBytes: 256 << 10, FrontDepth: 3})
	a := r.alloc
	hold := func(n, size int) []unsafe.Pointer {
		var ps []unsafe.Pointer
		for range n {
			p := a.cAlloc(size)
			if p == nil {
				t.Fatal(a.LastError())
			}
			ps = append(ps, p)
		}
		return ps
	}
	big, mid := hold(8, 64<<10), hold(4, 32<<10)
	pool0 := a.Pool().Stats().Frees
	for _, p := range big {
		a.cFree(p)
	}
	if st := a.Stats(); st.FrontBlocks != 3 || st.FrontBytes != 3*64<<10 || st.FrontKept != 3 || st.Frees != 8 {
		t.Errorf("8 blocks of 64 KiB freed with a depth of 3: %+v", st)
	}
	if got := a.Pool().Stats().Frees - pool0; got != 5 {
		t.Errorf("%d frees reached the pool, want the 5 past the depth", got)
	}
	for _, p := range mid {
		a.cFree(p)
	}
	// 192 KiB + two 32 KiB blocks = the 256 KiB cap; the other two go to Go.
	if st := a.Stats(); st.FrontBlocks != 5 || st.FrontBytes != 256<<10 || st.Live != 0 {
		t.Errorf("then 4 blocks of 32 KiB with a cap of 256 KiB: %+v", st)
	}
	r.auditZero(t, "bounded front")

	// Off: every Free reaches the pool.
	r.alloc.Close()
	off := newRig(t, 1<<30, Options{FrontBytes: -1})
	p := off.alloc.cAlloc(4096)
	off.alloc.cFree(p)
	if st := off.alloc.Stats(); st.FrontKept != 0 || st.FrontBlocks != 0 || off.alloc.frontEnabled() {
		t.Errorf("with FrontBytes -1: %+v", st)
	}
}

// TestFrontReclaimedUnderPressure: the only cache left is in the front (the
// pool's own cache trimmed, its segments all occupied by blocks the front
// holds, which the pool counts in use). Another holder's Reserve under a
// budget with no room succeeds: the governor asks the Allocator, a cache,
// which empties the front into the pool, and the pool gives the segments
// back. The ledger is exact after.
func TestFrontReclaimedUnderPressure(t *testing.T) {
	r := newRig(t, 1<<30, Options{Wait: -1})
	a := r.alloc
	var ps []unsafe.Pointer
	for range 48 { // 3 MiB of 64 KiB blocks
		p := a.cAlloc(64 << 10)
		if p == nil {
			t.Fatal(a.LastError())
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		a.cFree(p)
	}
	if st := a.Stats(); st.FrontBlocks != 48 {
		t.Fatalf("the front keeps %d blocks, want 48", st.FrontBlocks)
	}
	if _, err := a.Pool().Trim(context.Background()); err != nil { // the pool alone: it cannot touch the front's blocks
		t.Fatal(err)
	}
	r.settle(t)
	held := r.audit(t, "the front holds 3 MiB")
	if held < 3<<20 || a.Stats().FrontBytes != 3<<20 {
		t.Fatalf("charged %d, front %d bytes: want the front's 3 MiB charged", held, a.Stats().FrontBytes)
	}
	if c := a.CachedBytes(hostAuth); c < 3<<20 {
		t.Errorf("CachedBytes %d, want at least the front's 3 MiB", c)
	}
	if err := r.g.SetCapacity(hostAuth, held); err != nil { // no room
		t.Fatal(err)
	}
	kvBind, err := r.mgr.Bind("kv", "cache", memapi.DeviceKey{Kind: memapi.DeviceKindHost})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.g.Register("kv", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }), governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	kv, err := kvBind.Allocate(ctx, 2<<20)
	cancel()
	if err != nil {
		t.Fatalf("a Reserve of 2 MiB with 3 MiB in the front: %v", err)
	}
	if st := a.Stats(); st.FrontBlocks != 0 || st.Live != 0 {
		t.Errorf("after the pressure: %+v, want the front empty", st)
	}
	r.settle(t)
	s, _ := r.g.Authority(hostAuth)
	ps2 := a.Pool().Stats()
	if s.Charged != ps2.Segments+kv.Size() || r.m.UsedBytes() != s.Charged || ps2.InUse != 0 {
		t.Errorf("ledger: charged %d, pool segments %d (in use %d) + kv %d, mechanism %d", s.Charged, ps2.Segments, ps2.InUse, kv.Size(), r.m.UsedBytes())
	}
	if err := kv.Close(); err != nil {
		t.Fatal(err)
	}
	r.auditZero(t, "kv closed")
}

// TestFrontConcurrentThreads: four C threads (not Go's: as ONNX Runtime's
// intra-op threads are) Alloc and Free through the function pointers while
// a goroutine drains the front in a loop (Reclaim, Trim) and reads the
// figures; no two live blocks overlap (each carries a pattern checked at
// its Free), and after it the ledger is exact: the holder's charge is the
// pool's segments and the mechanism's bytes, and 0 after Close. Run it
// under -race.
func TestFrontConcurrentThreads(t *testing.T) {
	r := newRig(t, 1<<30, Options{FrontBytes: 1 << 20, FrontDepth: 8})
	a := r.alloc
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	reclaims := 0
	go func() {
		defer wg.Done()
		ctx := context.Background()
		for {
			select {
			case <-done:
				return
			default:
			}
			if reclaims%2 == 0 {
				a.Reclaim(ctx, governor.Ticket{Authority: hostAuth, Wanted: 1 << 20})
			} else {
				a.Trim(ctx)
			}
			_ = a.Stats()
			_ = a.CachedBytes(hostAuth)
			reclaims++
			time.Sleep(20 * time.Microsecond)
		}
	}()
	errs := a.frontStress(4, 100000)
	close(done)
	wg.Wait()
	if errs != 0 {
		t.Errorf("the C threads saw %d errors (refusals or overlapping blocks); last error %v", errs, a.LastError())
	}
	st := a.Stats()
	t.Logf("%d drains; %+v", reclaims, st)
	if st.FrontHits == 0 || st.FrontKept == 0 || st.Allocs != st.Frees || st.Live != 0 || st.FreeErrors != 0 {
		t.Errorf("after the threads: %+v", st)
	}
	r.audit(t, "after the threads")
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	r.settle(t)
	if s, _ := r.g.Authority(hostAuth); s.Charged != 0 || s.Pending != 0 || r.m.UsedBytes() != 0 {
		t.Errorf("after Close: charged %d pending %d, mechanism %d", s.Charged, s.Pending, r.m.UsedBytes())
	}
}

// TestFrontClose: Close with blocks in the front succeeds and gives every
// byte back; Close while ONNX Runtime holds a block fails with ErrInUse,
// counting that block only, and leaves the front working.
func TestFrontClose(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	a := r.alloc
	p, q := a.cAlloc(1000), a.cAlloc(64<<10)
	a.cFree(q)
	err := a.Close()
	var me *memapi.Error
	if !errors.Is(err, memapi.ErrInUse) || !errors.As(err, &me) || me.Wanted != 1024 {
		t.Fatalf("Close with one block held (1 KiB) and one in the front: %v, want memapi.ErrInUse for 1024 bytes", err)
	}
	if !a.frontEnabled() || a.Stats().FrontBlocks != 0 {
		t.Errorf("after the refused Close the front is on %v with %d blocks, want on and emptied", a.frontEnabled(), a.Stats().FrontBlocks)
	}
	a.cFree(p)
	if st := a.Stats(); st.FrontBlocks != 1 {
		t.Errorf("the front did not keep the Free after the refused Close: %+v", st)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close with a block in the front: %v", err)
	}
	r.settle(t)
	if s, _ := r.g.Authority(hostAuth); s.Charged != 0 || r.m.UsedBytes() != 0 {
		t.Errorf("after Close: charged %d, mechanism %d", s.Charged, r.m.UsedBytes())
	}
	if a.cAlloc(1000) != nil {
		t.Error("an Alloc after Close succeeded")
	}
}

// TestFrontOffWhileObserved: while observe is set the front is off, so that
// every call reaches Go and is recorded; unset, the front caches again.
func TestFrontOffWhileObserved(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	a := r.alloc
	a.cFree(a.cAlloc(512)) // one block in the front
	var mu sync.Mutex
	var ops []byte
	a.setObserve(func(op byte, addr, size uint64) {
		mu.Lock()
		ops = append(ops, op)
		mu.Unlock()
	})
	if a.frontEnabled() || a.Stats().FrontBlocks != 0 {
		t.Fatal("the front is still on (or holds blocks) while observed")
	}
	hits := a.Stats().FrontHits
	for range 2 {
		a.cFree(a.cAlloc(512))
	}
	if string(ops) != "afaf" || a.Stats().FrontHits != hits {
		t.Errorf("observed %q with %d front hits, want every call seen and no hit", ops, a.Stats().FrontHits-hits)
	}
	a.setObserve(nil)
	if !a.frontEnabled() {
		t.Error("the front stayed off once observe was unset")
	}
	r.auditZero(t, "observed")
}

// TestFrontMapCannotGrow: when the front's map cannot grow (calloc fails),
// the blocks Go serves are not tracked in C and their Frees go to Go, as
// without the front: nothing is lost, the ledger stays exact, and once
// memory is there again the front tracks and keeps blocks.
func TestFrontMapCannotGrow(t *testing.T) {
	r := newRig(t, 1<<30, Options{})
	a := r.alloc
	a.frontFailGrow(true)
	var ps []unsafe.Pointer
	for range 10 {
		p := a.cAlloc(4096)
		if p == nil {
			t.Fatal(a.LastError())
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		a.cFree(p)
	}
	if st := a.Stats(); st.FrontUntracked != 10 || st.FrontKept != 0 || st.FrontBlocks != 0 || st.Frees != 10 || st.Live != 0 || st.FreeErrors != 0 {
		t.Errorf("with the map unable to grow: %+v, want 10 untracked blocks freed through Go", st)
	}
	r.auditZero(t, "untracked")
	a.frontFailGrow(false)
	a.cFree(a.cAlloc(4096))
	if st := a.Stats(); st.FrontKept != 1 || st.FrontBlocks != 1 {
		t.Errorf("once the map can grow again: %+v, want the block kept", st)
	}
	r.auditZero(t, "tracked again")
}
