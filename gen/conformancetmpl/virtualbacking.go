//go:build memgentmpl

// memgen:needs VirtualBacking VirtualBacking.Reserve VirtualBacking.Commit VirtualBacking.Decommit VirtualBacking.CommittedBytes VirtualBacking.ReleaseReservation ErrCommitted ErrNotCommitted ErrInvalidRange

package conformance

import (
	"fmt"

	memapi "github.com/memgen/memgen/generated/memapi"
)

func (e *env) validReserve(t T) *callReserve {
	t.Helper()
	// One byte more than three granules: the reservation rounds up to four.
	return &callReserve{ctx: e.ctx, req: memapi.ReserveRequest{Size: 3*e.gran(t) + 1}}
}

func (e *env) validCommit(t T) *callCommit {
	t.Helper()
	g := e.gran(t)
	return &callCommit{ctx: e.ctx, res: e.reserve(t, 4*g), r: memapi.Range{Off: 0, Len: 2 * g}, grant: e.grant}
}

func (e *env) validDecommit(t T) *callDecommit {
	t.Helper()
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	e.commit(t, res, memapi.Range{Off: 0, Len: 4 * g})
	return &callDecommit{ctx: e.ctx, res: res, r: memapi.Range{Off: 0, Len: 2 * g}, to: e.account}
}

func (e *env) validCommittedBytes(t T) *callCommittedBytes {
	t.Helper()
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	e.commit(t, res, memapi.Range{Off: g, Len: g})
	return &callCommittedBytes{res: res}
}

func (e *env) validReleaseReservation(t T) *callReleaseReservation {
	t.Helper()
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	e.commit(t, res, memapi.Range{Off: g, Len: g})
	return &callReleaseReservation{ctx: e.ctx, res: res, to: e.account}
}

func (e *env) witnessCommit(t T, c *callCommit) func(memapi.Handle) {
	return func(memapi.Handle) {
		t.Helper()
		e.witnessed(t, "Commit", at(c.res, c.r.Off), c.r.Len)
	}
}

// witnessDecommit fills the committed range before the Decommit; afterwards
// it commits the range again, which must read zeros: a Decommit that freed
// nothing keeps the old bytes.
func (e *env) witnessDecommit(t T, c *callDecommit) func(memapi.Handle) {
	t.Helper()
	e.write(t, "before Decommit", at(c.res, c.r.Off), pattern(c.r.Len, 0x5a))
	return func(memapi.Handle) {
		t.Helper()
		if err := (&callCommit{ctx: e.ctx, res: c.res, r: c.r, grant: e.grant}).do(e); err != nil {
			t.Errorf("Commit of %v again after Decommit: %v", c.r, err)
			return
		}
		got := e.read(t, "Commit after Decommit", at(c.res, c.r.Off), c.r.Len)
		if i := firstDiff(got, make([]byte, len(got))); i >= 0 {
			t.Errorf("Decommit reported success, but committing %v again reads %#02x at byte %d, not zero: the old backing was kept", c.r, got[i], i)
		}
	}
}

// reserve reserves size bytes of address space; it must work.
func (e *env) reserve(t T, size memapi.Bytes) *memapi.Reservation {
	t.Helper()
	res, err := (&callReserve{ctx: e.ctx, req: memapi.ReserveRequest{Size: size}}).do(e)
	if err != nil {
		t.Fatalf("Reserve(%d): %v", size, err)
	}
	if res == nil {
		t.Fatalf("Reserve(%d) returned no Reservation", size)
	}
	return res
}

// commit commits r of res; it must work.
func (e *env) commit(t T, res *memapi.Reservation, r memapi.Range) {
	t.Helper()
	if err := (&callCommit{ctx: e.ctx, res: res, r: r, grant: e.grant}).do(e); err != nil {
		t.Fatalf("Commit(%v, %v): %v", res, r, err)
	}
}

// decommit decommits r of res; it must work.
func (e *env) decommit(t T, res *memapi.Reservation, r memapi.Range) {
	t.Helper()
	if err := (&callDecommit{ctx: e.ctx, res: res, r: r, to: e.account}).do(e); err != nil {
		t.Fatalf("Decommit(%v, %v): %v", res, r, err)
	}
}

// releaseReservation releases res; it must work.
func (e *env) releaseReservation(t T, res *memapi.Reservation) {
	t.Helper()
	if err := (&callReleaseReservation{ctx: e.ctx, res: res, to: e.account}).do(e); err != nil {
		t.Fatalf("ReleaseReservation(%v): %v", res, err)
	}
}

// at returns the address of offset off in res.
func at(res *memapi.Reservation, off memapi.Bytes) memapi.DeviceAddr {
	return res.Addr() + memapi.DeviceAddr(off)
}

// expectCommitted checks CommittedBytes(res) and UsedBytes.
func (e *env) expectCommitted(t T, what string, res *memapi.Reservation, committed, used memapi.Bytes) {
	t.Helper()
	if got := e.committedReservation(t, res); got != committed {
		t.Errorf("%s: CommittedBytes = %d, want %d", what, got, committed)
	}
	if got := e.m.UsedBytes(); got != used {
		t.Errorf("%s: UsedBytes = %d, want %d", what, got, used)
	}
}

func init() {
	vb := memapi.Of(memapi.CapVirtualBacking)
	scenarios = append(scenarios,
		test{"VirtualBacking/Reserve/rounds-to-granularity", vb, testReserveRounds},
		test{"VirtualBacking/Reserve/disjoint", vb, testReserveDisjoint},
		test{"VirtualBacking/Commit/round-trip", vb, testCommitRoundTrip},
		test{"VirtualBacking/Commit/fresh-reads-zeros", vb, testCommitFreshZeros},
		test{"VirtualBacking/Commit/already-committed", vb, testCommitAlreadyCommitted},
		test{"VirtualBacking/Commit/uncommitted-not-writable", vb, testUncommittedNotWritable},
		test{"VirtualBacking/Decommit/not-committed", vb, testDecommitNotCommitted},
		test{"VirtualBacking/CommittedBytes/tracks-commits", vb, testCommittedBytesTracks},
		test{"VirtualBacking/ReleaseReservation/releases-committed", vb, testReleaseReservationCommitted},
		test{"concurrency/VirtualBacking", vb, testConcurrentVirtualBacking},
	)
}

func testReserveRounds(t T, e *env) {
	g := e.gran(t)
	for _, c := range []struct{ size, want memapi.Bytes }{{g, g}, {g + 1, 2 * g}, {3*g - 1, 3 * g}} {
		res := e.reserve(t, c.size)
		if res.Size() != c.want {
			t.Errorf("Reserve(%d).Size() = %d, want %d (rounded up to the granularity %d)", c.size, res.Size(), c.want, g)
		}
		e.expectCommitted(t, fmt.Sprintf("after Reserve(%d)", c.size), res, 0, e.start)
		e.releaseReservation(t, res)
	}
}

func testReserveDisjoint(t T, e *env) {
	g := e.gran(t)
	a, b := e.reserve(t, 2*g), e.reserve(t, 2*g)
	if overlap(a.Addr(), a.Size(), b.Addr(), b.Size()) {
		t.Errorf("reservations [%#x, +%#x) and [%#x, +%#x) overlap", a.Addr(), a.Size(), b.Addr(), b.Size())
	}
	e.releaseReservation(t, a)
	e.releaseReservation(t, b)
}

func testCommitRoundTrip(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	addr := res.Addr()
	r := memapi.Range{Off: g, Len: 2 * g}
	e.commit(t, res, r)
	data := pattern(r.Len, 5)
	e.write(t, "committed range", at(res, r.Off), data)
	e.expectBytes(t, "committed range", at(res, r.Off), data)
	// Growing the backing elsewhere neither moves the address nor the bytes.
	e.commit(t, res, memapi.Range{Off: 3 * g, Len: g})
	if res.Addr() != addr {
		t.Errorf("the reservation moved from %#x to %#x", addr, res.Addr())
	}
	e.expectBytes(t, "first range after committing another", at(res, r.Off), data)
	e.expectCommitted(t, "after two commits", res, 3*g, e.start+3*g)
	e.decommit(t, res, memapi.Range{Off: 3 * g, Len: g})
	e.expectBytes(t, "first range after decommitting the other", at(res, r.Off), data)
	e.decommit(t, res, r)
	e.expectCommitted(t, "after decommitting both", res, 0, e.start)
	e.releaseReservation(t, res)
}

func testCommitFreshZeros(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 2*g)
	all := memapi.Range{Off: 0, Len: 2 * g}
	e.commit(t, res, all)
	zeros := make([]byte, all.Len)
	e.expectBytes(t, "fresh commit", res.Addr(), zeros)
	data := pattern(all.Len, 9)
	e.write(t, "committed range", res.Addr(), data)
	// Decommit and recommit the first granule: it reads zeros again, the
	// second keeps its bytes.
	e.decommit(t, res, memapi.Range{Off: 0, Len: g})
	e.commit(t, res, memapi.Range{Off: 0, Len: g})
	e.expectBytes(t, "recommitted granule that held data", res.Addr(), zeros[:g])
	e.expectBytes(t, "granule that stayed committed", at(res, g), data[g:])
	e.write(t, "recommitted granule", res.Addr(), data[:g])
	e.decommit(t, res, all)
	e.commit(t, res, all)
	e.expectBytes(t, "range recommitted whole", res.Addr(), zeros)
	e.decommit(t, res, all)
	e.releaseReservation(t, res)
}

func testCommitAlreadyCommitted(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	e.commit(t, res, memapi.Range{Off: g, Len: g})
	data := pattern(g, 11)
	e.write(t, "committed granule", at(res, g), data)
	c := &callCommit{ctx: e.ctx, res: res, grant: e.grant}
	for _, r := range []memapi.Range{{Off: g, Len: g}, {Off: 0, Len: 2 * g}, {Off: g, Len: 3 * g}, {Off: 0, Len: 4 * g}} {
		c.r = r
		refuse(t, fmt.Sprintf("Commit(%v) over the committed granule [%#x, +%#x)", r, g, g), []*env{e}, c.call, e, memapi.ErrCommitted)
	}
	e.expectBytes(t, "committed granule after the refused commits", at(res, g), data)
	e.expectCommitted(t, "after the refused commits", res, g, e.start+g)
	e.releaseReservation(t, res)
}

func testUncommittedNotWritable(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 2*g)
	e.refuseWrite(t, "writing into a reserved, uncommitted range", res.Addr(), pattern(g, 1), memapi.ErrNotCommitted, memapi.ErrInvalidRange)
	e.commit(t, res, memapi.Range{Off: 0, Len: g})
	data := pattern(g, 2)
	e.write(t, "committed granule", res.Addr(), data)
	e.refuseWrite(t, "writing into the uncommitted granule beside a committed one", at(res, g), pattern(g, 3), memapi.ErrNotCommitted, memapi.ErrInvalidRange)
	e.decommit(t, res, memapi.Range{Off: 0, Len: g})
	e.refuseWrite(t, "writing into a decommitted range", res.Addr(), pattern(g, 4), memapi.ErrNotCommitted, memapi.ErrInvalidRange)
	e.releaseReservation(t, res)
}

func testDecommitNotCommitted(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	c := &callDecommit{ctx: e.ctx, res: res, to: e.account}
	c.r = memapi.Range{Off: 0, Len: g}
	refuse(t, "Decommit of a never committed granule", []*env{e}, c.call, e, memapi.ErrNotCommitted)
	e.commit(t, res, memapi.Range{Off: 0, Len: g})
	data := pattern(g, 13)
	e.write(t, "committed granule", res.Addr(), data)
	c.r = memapi.Range{Off: 0, Len: 2 * g}
	refuse(t, "Decommit of a range only half committed", []*env{e}, c.call, e, memapi.ErrNotCommitted)
	c.r = memapi.Range{Off: 2 * g, Len: g}
	refuse(t, "Decommit of an uncommitted granule beside a committed one", []*env{e}, c.call, e, memapi.ErrNotCommitted)
	e.expectBytes(t, "committed granule after the refused decommits", res.Addr(), data)
	e.decommit(t, res, memapi.Range{Off: 0, Len: g})
	c.r = memapi.Range{Off: 0, Len: g}
	refuse(t, "Decommit of a granule already decommitted", []*env{e}, c.call, e, memapi.ErrNotCommitted)
	e.releaseReservation(t, res)
}

func testCommittedBytesTracks(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 8*g)
	steps := []struct {
		commit bool
		r      memapi.Range
		after  memapi.Bytes
	}{
		{true, memapi.Range{Off: 0, Len: g}, g},
		{true, memapi.Range{Off: 2 * g, Len: 3 * g}, 4 * g},
		{false, memapi.Range{Off: 3 * g, Len: g}, 3 * g},
		{true, memapi.Range{Off: 7 * g, Len: g}, 4 * g},
		{false, memapi.Range{Off: 0, Len: g}, 3 * g},
		{true, memapi.Range{Off: 0, Len: 2 * g}, 5 * g},
		{false, memapi.Range{Off: 0, Len: 3 * g}, 2 * g},
	}
	for _, s := range steps {
		what := fmt.Sprintf("after Decommit(%v)", s.r)
		if s.commit {
			e.commit(t, res, s.r)
			what = fmt.Sprintf("after Commit(%v)", s.r)
		} else {
			e.decommit(t, res, s.r)
		}
		e.expectCommitted(t, what, res, s.after, e.start+s.after)
	}
	other := e.reserve(t, 2*g)
	e.commit(t, other, memapi.Range{Off: g, Len: g})
	e.expectCommitted(t, "after committing in another reservation", res, 2*g, e.start+3*g)
	e.expectCommitted(t, "the other reservation", other, g, e.start+3*g)
	e.releaseReservation(t, other)
	e.releaseReservation(t, res)
	if got := e.m.UsedBytes(); got != e.start {
		t.Errorf("after releasing both reservations: UsedBytes = %d, want %d", got, e.start)
	}
}

func testReleaseReservationCommitted(t T, e *env) {
	g := e.gran(t)
	res := e.reserve(t, 4*g)
	e.commit(t, res, memapi.Range{Off: 0, Len: g})
	e.commit(t, res, memapi.Range{Off: 2 * g, Len: 2 * g})
	before := e.books()
	e.releaseReservation(t, res)
	e.expectRefunded(t, "ReleaseReservation of a reservation with 3 committed granules", before, 3*g)
	if res.Live() {
		t.Errorf("the reservation is still live after ReleaseReservation")
	}
}

func testConcurrentVirtualBacking(t T, e *env) {
	g := e.gran(t)
	const workers = 4
	shared := e.reserve(t, 2*workers*g)
	parallel(t, workers, func(w int) error {
		s, err := e.dc.NewStream()
		if err != nil {
			return err
		}
		defer s.Close()
		mine := memapi.Range{Off: memapi.Bytes(2*w) * g, Len: 2 * g}
		for i := range 8 {
			// Commit and decommit a private part of the shared reservation.
			if err := (&callCommit{ctx: e.ctx, res: shared, r: mine, grant: e.grant}).do(e); err != nil {
				return fmt.Errorf("Commit(%v): %w", mine, err)
			}
			data := pattern(mine.Len, byte(w*8+i))
			if err := e.writeOn(s, at(shared, mine.Off), data); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			got, err := e.readOn(s, at(shared, mine.Off), mine.Len)
			if err != nil {
				return fmt.Errorf("read: %w", err)
			}
			if j := firstDiff(got, data); j >= 0 {
				return fmt.Errorf("byte %d of %v changed under concurrent use", j, mine)
			}
			if err := (&callDecommit{ctx: e.ctx, res: shared, r: mine, to: e.account}).do(e); err != nil {
				return fmt.Errorf("Decommit(%v): %w", mine, err)
			}
			// And a reservation of its own, released with its backing.
			res, err := (&callReserve{ctx: e.ctx, req: memapi.ReserveRequest{Size: g}}).do(e)
			if err != nil {
				return fmt.Errorf("calling Reserve: %w", err)
			}
			if err := (&callCommit{ctx: e.ctx, res: res, r: memapi.Range{Len: g}, grant: e.grant}).do(e); err != nil {
				return fmt.Errorf("calling Commit: %w", err)
			}
			if _, err := (&callReleaseReservation{ctx: e.ctx, res: res, to: e.account}).call(e); err != nil {
				return fmt.Errorf("ReleaseReservation: %w", err)
			}
		}
		return nil
	})
	e.expectCommitted(t, "after the workers", shared, 0, e.start)
	e.releaseReservation(t, shared)
}
