package ort

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pmm"
)

// holderFigures is one holder's charged and pending bytes on the host
// authority.
func holderFigures(g *governor.Governor, id governor.HolderID) (charged, pending memapi.Bytes) {
	for _, h := range g.Snapshot().Holders {
		if h.ID == id {
			for _, a := range h.Authorities {
				if a.Authority == hostAuth {
					return a.Charged, a.Pending
				}
			}
		}
	}
	return 0, 0
}

// TestTwoSessionPoolsUnderOneBudget: two ONNX Runtime sessions, each
// allocating through its own Allocator (binding, pool, holder), and a third
// holder that holds data and gives nothing back, under one budget. Once the
// sessions have run, the budget is cut to what is charged plus 2 MiB; the
// third holder's Reserve of most of what the two pools cache succeeds,
// because the governor asks the caches first and the pools give their free
// segments back; a fourth holder, of lower priority, whose data could be
// evicted, is not asked. Runs under the tight budget either succeed exactly or fail
// with ONNX Runtime's allocation status. At every quiescent point the
// ledger is exact: each holder's charge is its pool's segments plus its
// reserved buffers (the third's, its buffer), their sum is the mechanism's
// and the kernel's count; after the sessions are destroyed and the
// allocators closed, everything is zero.
//
// ONNX Runtime keeps one CPU allocator in its environment (a second
// RegisterAllocator replaces the first; NewAllocator refuses it instead,
// which the test checks), and a session takes the environment's allocator
// when it is created. So: register A, create session 1, unregister A (it
// keeps serving session 1), register B, create session 2. The test checks
// that each session's runs reach its own allocator only.
func TestTwoSessionPoolsUnderOneBudget(t *testing.T) {
	needFan(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a failure must not hang the closes
	defer cancel()
	g, m, ectx, mgr := newHost(t, 1<<30)
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	settle := func() {
		t.Helper()
		if err := ectx.Queue().Drain(ctx); err != nil {
			t.Fatal(err)
		}
	}
	newAlloc := func(holder string) *Allocator {
		t.Helper()
		b, err := mgr.Bind(holder, "session", host)
		if err != nil {
			t.Fatal(err)
		}
		a, err := NewAllocator(b, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Register(governor.HolderID(holder), a, governor.HolderOptions{Cache: true}); err != nil {
			t.Fatal(err)
		}
		return a
	}

	a := newAlloc("ort-a")
	s1, err := newSessionWith(fanModel, sessEnvAllocators|sessNoMemPattern, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.close()
	bb, err := mgr.Bind("ort-b", "session", host)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewAllocator(bb, Options{}); !errors.Is(err, memapi.ErrInUse) {
		t.Fatalf("a second Allocator while one is registered: %v, want memapi.ErrInUse", err)
	}
	if err := a.Unregister(); err != nil {
		t.Fatal(err)
	}
	b := newAlloc("ort-b")
	s2, err := newSessionWith(fanModel, sessEnvAllocators|sessNoMemPattern, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.close()
	def, err := newSessionWith(fanModel, sessNoMemPattern, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer def.close()

	kvBind, err := mgr.Bind("kv", "cache", host)
	if err != nil {
		t.Fatal(err)
	}
	// A holder of data that gives nothing back: only the caches can.
	if err := g.Register("kv", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }), governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	// A holder of data it can evict (say, offloadable weights), of lower
	// priority than everyone: the governor would ask it first if the
	// pools' caches were not caches (HolderOptions.Cache), and it must not
	// be asked while they cover the shortfall.
	wBind, err := mgr.Bind("weights", "offload", host)
	if err != nil {
		t.Fatal(err)
	}
	var weights *pmm.Buffer
	var evicted bool
	if err := g.Register("weights", governor.HolderFunc(func(context.Context, governor.Ticket) (memapi.Bytes, error) {
		if evicted {
			return 0, nil
		}
		evicted = true
		n := weights.Size()
		return n, weights.Close()
	}), governor.HolderOptions{Priority: -1}); err != nil {
		t.Fatal(err)
	}
	weights, err = wBind.Allocate(ctx, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	weightsHeld := weights.Size()

	// audit checks the ledger at a quiescent point and returns the total
	// charge.
	var kvHeld memapi.Bytes
	audit := func(what string) memapi.Bytes {
		t.Helper()
		settle()
		s, _ := g.Authority(hostAuth)
		used := m.UsedBytes()
		kern, err := m.KernelBytes()
		if err != nil {
			t.Fatal(err)
		}
		var sum memapi.Bytes
		for _, h := range []struct {
			id    governor.HolderID
			alloc *Allocator
		}{{"ort-a", a}, {"ort-b", b}} {
			charged, pending := holderFigures(g, h.id)
			ps, st := h.alloc.Pool().Stats(), h.alloc.Stats()
			if charged != ps.Segments+st.ReservedBytes || pending != 0 || st.LiveBytes+st.FrontBytes != ps.InUse+st.ReservedBytes || ps.Cached+ps.InUse != ps.Segments {
				t.Errorf("%s: %s charged %d pending %d; pool segments %d (in use %d, cached %d), reserved %d, live %d, front %d",
					what, h.id, charged, pending, ps.Segments, ps.InUse, ps.Cached, st.ReservedBytes, st.LiveBytes, st.FrontBytes)
			}
			sum += charged
		}
		if charged, pending := holderFigures(g, "kv"); charged != kvHeld || pending != 0 {
			t.Errorf("%s: kv charged %d pending %d, holds %d", what, charged, pending, kvHeld)
		}
		sum += kvHeld
		wantW := weightsHeld
		if evicted {
			wantW = 0
		}
		if charged, pending := holderFigures(g, "weights"); charged != wantW || pending != 0 {
			t.Errorf("%s: weights charged %d pending %d, holds %d", what, charged, pending, wantW)
		}
		sum += wantW
		if !s.Balanced() || s.Charged != sum || s.Pending != 0 || s.Reserved != 0 || used != s.Charged || kern != used {
			t.Errorf("%s: authority charged %d (holders %d) pending %d reserved %d balanced %v; mechanism %d, kernel %d",
				what, s.Charged, sum, s.Pending, s.Reserved, s.Balanced(), used, kern)
		}
		return s.Charged
	}

	// Each session reaches its own allocator only.
	runOn := func(s *session, batch int) ([]tensor, error) {
		return s.run([]tensor{fanInput(batch)})
	}
	for _, c := range []struct {
		s           *session
		mine, other *Allocator
	}{{s1, a, b}, {s2, b, a}} {
		mine, other := c.mine.Stats().Allocs, c.other.Stats().Allocs
		for _, batch := range []int{256, 160} {
			if _, err := runOn(c.s, batch); err != nil {
				t.Fatal(err)
			}
		}
		if c.mine.Stats().Allocs-mine <= fanBranches || c.other.Stats().Allocs != other {
			t.Errorf("a session's runs reached the wrong allocator: own %d -> %d, other %d -> %d",
				mine, c.mine.Stats().Allocs, other, c.other.Stats().Allocs)
		}
	}
	charged := audit("both sessions ran")
	cachedA, cachedB := a.CachedBytes(hostAuth), b.CachedBytes(hostAuth) // the pools' and the fronts' caches
	if cachedA < 8<<20 || cachedB < 8<<20 {
		t.Fatalf("the pools cache %d and %d bytes after the runs, want at least 8 MiB each", cachedA, cachedB)
	}

	// Cut the budget: 2 MiB free. The kv holder wants most of the caches.
	if err := g.SetCapacity(hostAuth, charged+2<<20); err != nil {
		t.Fatal(err)
	}
	want := cachedA + cachedB - 4<<20
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	kv, err := kvBind.Allocate(rctx, want)
	rcancel()
	if err != nil {
		t.Fatalf("kv's Reserve of %d bytes with %d cached in the pools: %v", want, cachedA+cachedB, err)
	}
	kvHeld = kv.Size()
	audit("kv holds its buffer")
	if evicted {
		t.Error("the evictable weights were asked before the pools' caches")
	}
	ra, rb := a.Pool().Stats(), b.Pool().Stats()
	if ra.Reclaimed+rb.Reclaimed < want-2<<20 || ra.Reclaims+rb.Reclaims == 0 {
		t.Errorf("the pools gave back %d and %d bytes (%d and %d reclaims), want at least %d between them",
			ra.Reclaimed, rb.Reclaimed, ra.Reclaims, rb.Reclaims, want-2<<20)
	}
	t.Logf("budget %d; kv holds %d; pools gave back %d and %d bytes", charged+2<<20, kvHeld, ra.Reclaimed, rb.Reclaimed)

	// Under the tight budget a run either succeeds exactly or fails with
	// ONNX Runtime's allocation status; nothing crashes.
	var ok, refused int
	for i, batch := range []int{8, 256, 33, 160} {
		for _, s := range []*session{s1, s2} {
			got, err := runOn(s, batch)
			if err != nil {
				refused++
				if !isAllocFailure(err) {
					t.Errorf("run %d failed with something other than an allocation failure: %v", i, err)
				}
				continue
			}
			ok++
			wantOut, err := runOn(def, batch)
			if err != nil {
				t.Fatal(err)
			}
			if err := compare(got[0], wantOut[0]); err != nil {
				t.Errorf("run %d under the tight budget: %v", i, err)
			}
		}
	}
	t.Logf("under the tight budget: %d runs succeeded, %d failed on the budget", ok, refused)
	audit("after the tight runs")

	// Destroy everything: the ledger goes to zero exactly.
	if err := kv.Close(); err != nil {
		t.Fatal(err)
	}
	kvHeld = 0
	if !evicted {
		if err := weights.Close(); err != nil {
			t.Fatal(err)
		}
		weightsHeld = 0
	}
	s1.close()
	s2.close()
	audit("sessions destroyed")
	for _, al := range []*Allocator{a, b} {
		if st := al.Stats(); st.Live != 0 {
			t.Errorf("%d blocks live after the sessions were destroyed", st.Live)
		}
		if err := al.Close(); err != nil {
			t.Error(err)
		}
	}
	for _, al := range []*Allocator{a, b} {
		if err := al.Close(); err != nil {
			t.Errorf("a second Close: %v", err)
		}
	}
	settle()
	if s, _ := g.Authority(hostAuth); s.Charged != 0 || s.Pending != 0 || m.UsedBytes() != 0 {
		t.Errorf("after Close: charged %d pending %d, mechanism %d", s.Charged, s.Pending, m.UsedBytes())
	}
	if kern, err := m.KernelBytes(); err != nil || kern != 0 {
		t.Errorf("after Close the kernel counts %d bytes (%v)", kern, err)
	}
	if err := mgr.Close(ctx); err != nil {
		t.Error(err)
	}
	if err := ectx.Close(ctx, true); err != nil {
		t.Error(err)
	}
	if err := g.Close(); err != nil {
		t.Error(err)
	}
}
