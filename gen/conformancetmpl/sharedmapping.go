//go:build memgentmpl

// memgen:needs VirtualBacking.Reserve VirtualBacking.Commit VirtualBacking.Decommit VirtualBacking.ReleaseReservation VirtualBacking.CommittedBytes SharedMapping SharedMapping.CreateBacking SharedMapping.MapView SharedMapping.UnmapView SharedMapping.CopyOnWrite SharedMapping.ViewCount SharedMapping.ReleaseBacking AccessReadOnly AccessReadWrite ErrReadOnly ErrInUse ErrCommitted ErrNotCommitted ErrInvalidRange

package conformance

import (
	"fmt"

	memapi "github.com/memgen/memgen/generated/memapi"
)

func (e *env) validCreateBacking(t T) *callCreateBacking {
	t.Helper()
	// One byte more than a granule: the backing rounds up to two.
	return &callCreateBacking{ctx: e.ctx, size: e.gran(t) + 1, grant: e.grant}
}

func (e *env) validMapView(t T) *callMapView {
	t.Helper()
	g := e.gran(t)
	return &callMapView{ctx: e.ctx, res: e.reserve(t, 4*g), r: memapi.Range{Off: 0, Len: 2 * g}, b: e.createBacking(t, 2*g), access: memapi.AccessReadWrite}
}

func (e *env) validUnmapView(t T) *callUnmapView {
	t.Helper()
	g := e.gran(t)
	return &callUnmapView{ctx: e.ctx, v: e.mapView(t, e.reserve(t, 2*g), memapi.Range{Off: g, Len: g}, e.createBacking(t, g), memapi.AccessReadWrite)}
}

func (e *env) validCopyOnWrite(t T) *callCopyOnWrite {
	t.Helper()
	g := e.gran(t)
	return &callCopyOnWrite{ctx: e.ctx, v: e.mapView(t, e.reserve(t, 4*g), memapi.Range{Off: g, Len: g}, e.createBacking(t, g), memapi.AccessReadOnly), grant: e.grant}
}

func (e *env) validViewCount(t T) *callViewCount {
	t.Helper()
	g := e.gran(t)
	b := e.createBacking(t, g)
	e.mapView(t, e.reserve(t, g), memapi.Range{Len: g}, b, memapi.AccessReadOnly)
	return &callViewCount{b: b}
}

func (e *env) validReleaseBacking(t T) *callReleaseBacking {
	t.Helper()
	return &callReleaseBacking{ctx: e.ctx, b: e.createBacking(t, 2*e.gran(t)), to: e.account}
}

// witnessCreateBacking maps the new backing read-write into a reservation of
// its own and writes and reads every byte through it.
func (e *env) witnessCreateBacking(t T, c *callCreateBacking) func(memapi.Handle) {
	return func(h memapi.Handle) {
		t.Helper()
		b, _ := h.(*memapi.Backing)
		if b == nil {
			t.Errorf("CreateBacking reported success with no Backing")
			return
		}
		res := e.reserve(t, b.Size())
		v := e.mapView(t, res, memapi.Range{Len: b.Size()}, b, memapi.AccessReadWrite)
		e.witnessed(t, "CreateBacking", viewAddr(v), b.Size())
	}
}

func (e *env) witnessCopyOnWrite(t T, c *callCopyOnWrite) func(memapi.Handle) {
	return func(h memapi.Handle) {
		t.Helper()
		v, _ := h.(*memapi.View)
		if v == nil {
			t.Errorf("CopyOnWrite reported success with no View")
			return
		}
		e.witnessed(t, "CopyOnWrite", viewAddr(v), v.Range().Len)
	}
}

// createBacking creates a backing of size bytes; it must work.
func (e *env) createBacking(t T, size memapi.Bytes) *memapi.Backing {
	t.Helper()
	b, err := (&callCreateBacking{ctx: e.ctx, size: size, grant: e.grant}).do(e)
	if err != nil {
		t.Fatalf("CreateBacking(%d): %v", size, err)
	}
	if b == nil {
		t.Fatalf("CreateBacking(%d) returned no Backing", size)
	}
	return b
}

// mapView maps b at r of res; it must work.
func (e *env) mapView(t T, res *memapi.Reservation, r memapi.Range, b *memapi.Backing, access memapi.Access) *memapi.View {
	t.Helper()
	v, err := (&callMapView{ctx: e.ctx, res: res, r: r, b: b, access: access}).do(e)
	if err != nil {
		t.Fatalf("MapView(%v, %v, %v, %v): %v", res, r, b, access, err)
	}
	if v == nil {
		t.Fatalf("MapView returned no View")
	}
	return v
}

// unmapView unmaps v; it must work.
func (e *env) unmapView(t T, v *memapi.View) {
	t.Helper()
	if err := (&callUnmapView{ctx: e.ctx, v: v}).do(e); err != nil {
		t.Fatalf("UnmapView(%v): %v", v, err)
	}
}

// releaseBacking releases b; it must work.
func (e *env) releaseBacking(t T, b *memapi.Backing) {
	t.Helper()
	if err := (&callReleaseBacking{ctx: e.ctx, b: b, to: e.account}).do(e); err != nil {
		t.Fatalf("ReleaseBacking(%v): %v", b, err)
	}
}

// expectViews checks ViewCount(b).
func (e *env) expectViews(t T, what string, b *memapi.Backing, want int) {
	t.Helper()
	n, err := e.sharedMapping.ViewCount(b)
	if err != nil {
		t.Fatalf("%s: ViewCount(%v): %v", what, b, err)
	}
	if n != want {
		t.Errorf("%s: ViewCount = %d, want %d", what, n, want)
	}
}

// viewAddr is the address a view maps.
func viewAddr(v *memapi.View) memapi.DeviceAddr { return at(v.Reservation(), v.Range().Off) }

func init() {
	sm := memapi.Of(memapi.CapVirtualBacking, memapi.CapSharedMapping)
	scenarios = append(scenarios,
		test{"SharedMapping/CreateBacking/fresh-reads-zeros", sm, testBackingFreshZeros},
		test{"SharedMapping/MapView/shared-views-see-same-bytes", sm, testSharedViews},
		test{"SharedMapping/MapView/read-only-refuses-writes", sm, testReadOnlyView},
		test{"SharedMapping/MapView/over-committed-or-mapped", sm, testMapViewOverlap},
		test{"SharedMapping/UnmapView/backing-stays-alive", sm, testUnmapKeepsBacking},
		test{"SharedMapping/CopyOnWrite/private-copy", sm, testCopyOnWritePrivate},
		test{"SharedMapping/ReleaseBacking/in-use", sm, testReleaseBackingInUse},
		test{"SharedMapping/ReleaseReservation/in-use", sm, testReleaseReservationInUse},
		test{"concurrency/SharedMapping", sm, testConcurrentSharedMapping},
	)
}

func testBackingFreshZeros(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, 2*g)
	res := e.reserve(t, 2*g)
	v := e.mapView(t, res, memapi.Range{Len: 2 * g}, b, memapi.AccessReadWrite)
	e.expectBytes(t, "fresh backing", viewAddr(v), make([]byte, 2*g))
	e.unmapView(t, v)
	e.releaseBacking(t, b)
	e.releaseReservation(t, res)
}

func testSharedViews(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	res1, res2 := e.reserve(t, 4*g), e.reserve(t, 2*g)
	v1 := e.mapView(t, res1, memapi.Range{Off: 0, Len: g}, b, memapi.AccessReadWrite)
	v2 := e.mapView(t, res2, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadWrite)
	v3 := e.mapView(t, res1, memapi.Range{Off: 2 * g, Len: g}, b, memapi.AccessReadOnly)
	e.expectViews(t, "three views", b, 3)
	// The backing counts once, the views add nothing, and none of it is committed.
	e.expectCommitted(t, "three views of one backing", res1, 0, e.start+g)
	p := pattern(g, 21)
	e.write(t, "first view", viewAddr(v1), p)
	e.expectBytes(t, "second view after writing the first", viewAddr(v2), p)
	e.expectBytes(t, "read-only view after writing the first", viewAddr(v3), p)
	q := pattern(g, 22)
	e.write(t, "second view", viewAddr(v2), q)
	e.expectBytes(t, "first view after writing the second", viewAddr(v1), q)
	e.expectBytes(t, "read-only view after writing the second", viewAddr(v3), q)
	for _, v := range []*memapi.View{v1, v2, v3} {
		e.unmapView(t, v)
	}
	e.expectViews(t, "views unmapped", b, 0)
	e.releaseBacking(t, b)
	e.releaseReservation(t, res1)
	e.releaseReservation(t, res2)
}

func testReadOnlyView(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	res := e.reserve(t, 2*g)
	rw := e.mapView(t, res, memapi.Range{Off: 0, Len: g}, b, memapi.AccessReadWrite)
	ro := e.mapView(t, res, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadOnly)
	if ro.Access() != memapi.AccessReadOnly {
		t.Errorf("the read-only view reports access %v", ro.Access())
	}
	p := pattern(g, 31)
	e.write(t, "read-write view", viewAddr(rw), p)
	e.refuseWrite(t, "writing through the read-only view", viewAddr(ro), pattern(g, 32), memapi.ErrReadOnly)
	e.refuseWrite(t, "writing one byte through the read-only view", viewAddr(ro)+memapi.DeviceAddr(g/2), []byte{0}, memapi.ErrReadOnly)
	e.expectBytes(t, "read-only view after the refused writes", viewAddr(ro), p)
	e.expectBytes(t, "read-write view after the refused writes", viewAddr(rw), p)
	e.unmapView(t, ro)
	e.unmapView(t, rw)
	e.releaseBacking(t, b)
	e.releaseReservation(t, res)
}

func testMapViewOverlap(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	b := e.createBacking(t, g)
	e.commit(t, res, memapi.Range{Off: 0, Len: g})
	v := e.mapView(t, res, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadWrite)
	mv := &callMapView{ctx: e.ctx, res: res, b: b, access: memapi.AccessReadWrite}
	mv.r = memapi.Range{Off: 0, Len: g}
	refuse(t, "MapView over a committed granule", []*env{e}, mv.call, e, memapi.ErrCommitted)
	mv.r = memapi.Range{Off: g, Len: g}
	refuse(t, "MapView over a mapped view", []*env{e}, mv.call, e, memapi.ErrCommitted)
	c := &callCommit{ctx: e.ctx, res: res, r: memapi.Range{Off: g, Len: g}, grant: e.grant}
	refuse(t, "Commit over a mapped view", []*env{e}, c.call, e, memapi.ErrCommitted)
	c.r = memapi.Range{Off: g, Len: 2 * g}
	refuse(t, "Commit of a range overlapping a mapped view", []*env{e}, c.call, e, memapi.ErrCommitted)
	d := &callDecommit{ctx: e.ctx, res: res, r: memapi.Range{Off: g, Len: g}, to: e.account}
	refuse(t, "Decommit of a mapped view's range", []*env{e}, d.call, e, memapi.ErrNotCommitted)
	e.unmapView(t, v)
	e.decommit(t, res, memapi.Range{Off: 0, Len: g})
	e.releaseBacking(t, b)
	e.releaseReservation(t, res)
}

func testUnmapKeepsBacking(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	res := e.reserve(t, 2*g)
	v1 := e.mapView(t, res, memapi.Range{Off: 0, Len: g}, b, memapi.AccessReadWrite)
	v2 := e.mapView(t, res, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadOnly)
	p := pattern(g, 41)
	e.write(t, "first view", viewAddr(v1), p)
	before := e.books()
	e.unmapView(t, v1)
	e.expectConsumed(t, "UnmapView of one of two views", before, 0)
	e.expectViews(t, "one view unmapped", b, 1)
	e.expectBytes(t, "remaining view", viewAddr(v2), p)
	e.refuseWrite(t, "writing into the unmapped view's range", viewAddr(v1), pattern(g, 42), memapi.ErrNotCommitted, memapi.ErrInvalidRange)
	v3 := e.mapView(t, res, memapi.Range{Off: 0, Len: g}, b, memapi.AccessReadWrite)
	e.expectBytes(t, "view remapped at the unmapped range", viewAddr(v3), p)
	e.unmapView(t, v2)
	e.unmapView(t, v3)
	e.releaseBacking(t, b)
	e.releaseReservation(t, res)
}

func testCopyOnWritePrivate(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	res := e.reserve(t, 4*g)
	rw := e.mapView(t, res, memapi.Range{Off: 0, Len: g}, b, memapi.AccessReadWrite)
	p := pattern(g, 51)
	e.write(t, "read-write view", viewAddr(rw), p)
	v1 := e.mapView(t, res, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadOnly)
	v2 := e.mapView(t, res, memapi.Range{Off: 2 * g, Len: g}, b, memapi.AccessReadOnly)
	before := e.books()
	nv, err := (&callCopyOnWrite{ctx: e.ctx, v: v1, grant: e.grant}).do(e)
	if err != nil {
		t.Fatalf("CopyOnWrite: %v", err)
	}
	if nv == nil {
		t.Fatalf("CopyOnWrite returned no View")
	}
	e.expectConsumed(t, "CopyOnWrite of a one-granule view", before, g)
	switch {
	case v1.Live():
		t.Errorf("the replaced view is still live after CopyOnWrite")
	case !nv.Live():
		t.Errorf("the new view is not live")
	case nv.Access() != memapi.AccessReadWrite:
		t.Errorf("the new view has access %v, want %v", nv.Access(), memapi.AccessReadWrite)
	case nv.Reservation() != res || nv.Range() != v1.Range():
		t.Errorf("the new view maps %v %v, want %v %v", nv.Reservation(), nv.Range(), res, v1.Range())
	case nv.Backing() == nil || nv.Backing() == b:
		t.Errorf("the new view is not backed by a new private backing")
	}
	e.expectViews(t, "shared backing after CopyOnWrite", b, 2)
	e.expectBytes(t, "the copy", viewAddr(nv), p)
	q := pattern(g, 52)
	e.write(t, "the copy", viewAddr(nv), q)
	e.expectBytes(t, "the copy after writing it", viewAddr(nv), q)
	e.expectBytes(t, "other read-only view after writing the copy", viewAddr(v2), p)
	e.expectBytes(t, "read-write view after writing the copy", viewAddr(rw), p)
	// The copy's backing is the caller's: unmap the view, release the backing.
	nb := nv.Backing()
	e.unmapView(t, nv)
	before = e.books()
	e.releaseBacking(t, nb)
	e.expectRefunded(t, "ReleaseBacking of the copy's backing", before, g)
	e.unmapView(t, v2)
	e.unmapView(t, rw)
	e.releaseBacking(t, b)
	e.releaseReservation(t, res)
}

func testReleaseBackingInUse(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	res := e.reserve(t, g)
	v := e.mapView(t, res, memapi.Range{Len: g}, b, memapi.AccessReadOnly)
	c := &callReleaseBacking{ctx: e.ctx, b: b, to: e.account}
	refuse(t, "ReleaseBacking of a backing with a mapped view", []*env{e}, c.call, e, memapi.ErrInUse)
	e.unmapView(t, v)
	if _, err := c.call(e); err != nil {
		t.Errorf("ReleaseBacking after the last view was unmapped: %v", err)
	}
	e.releaseReservation(t, res)
}

func testReleaseReservationInUse(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	res := e.reserve(t, 2*g)
	e.commit(t, res, memapi.Range{Off: g, Len: g})
	v := e.mapView(t, res, memapi.Range{Len: g}, b, memapi.AccessReadWrite)
	c := &callReleaseReservation{ctx: e.ctx, res: res, to: e.account}
	refuse(t, "ReleaseReservation of a reservation with a mapped view", []*env{e}, c.call, e, memapi.ErrInUse)
	e.unmapView(t, v)
	before := e.books()
	if _, err := c.call(e); err != nil {
		t.Errorf("ReleaseReservation after the view was unmapped: %v", err)
	}
	e.expectRefunded(t, "ReleaseReservation", before, g)
	e.releaseBacking(t, b)
}

func testConcurrentSharedMapping(t T, e *env) {
	g := e.gran(t)
	b := e.createBacking(t, g)
	setup := e.reserve(t, g)
	rw := e.mapView(t, setup, memapi.Range{Len: g}, b, memapi.AccessReadWrite)
	p := pattern(g, 61)
	e.write(t, "shared backing", viewAddr(rw), p)
	parallel(t, 4, func(w int) error {
		s, err := e.dc.NewStream()
		if err != nil {
			return err
		}
		defer s.Close()
		res, err := (&callReserve{ctx: e.ctx, req: memapi.ReserveRequest{Size: 2 * g}}).do(e)
		if err != nil {
			return fmt.Errorf("calling Reserve: %w", err)
		}
		for i := range 8 {
			r := memapi.Range{Off: memapi.Bytes(i%2) * g, Len: g}
			v, err := (&callMapView{ctx: e.ctx, res: res, r: r, b: b, access: memapi.AccessReadOnly}).do(e)
			if err != nil {
				return fmt.Errorf("MapView: %w", err)
			}
			got, err := e.readOn(s, viewAddr(v), g)
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if j := firstDiff(got, p); j >= 0 {
				return fmt.Errorf("byte %d read through view %v differs", j, v)
			}
			if err := (&callUnmapView{ctx: e.ctx, v: v}).do(e); err != nil {
				return fmt.Errorf("UnmapView: %w", err)
			}
		}
		if _, err := (&callReleaseReservation{ctx: e.ctx, res: res, to: e.account}).call(e); err != nil {
			return fmt.Errorf("ReleaseReservation: %w", err)
		}
		return nil
	})
	e.expectViews(t, "after the workers", b, 1)
	e.unmapView(t, rw)
	e.releaseBacking(t, b)
	e.releaseReservation(t, setup)
}
