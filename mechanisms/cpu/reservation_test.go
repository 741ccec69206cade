package cpu

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// granularities runs f once per supported granularity.
func granularities(t *testing.T, f func(t *testing.T, gran memapi.Bytes)) {
	for _, gran := range []memapi.Bytes{Granularity4KiB, Granularity2MiB} {
		t.Run(fmt.Sprintf("gran=%dKiB", gran/kib), func(t *testing.T) { f(t, gran) })
	}
}

func TestReserveCommitDecommit(t *testing.T) {
	granularities(t, func(t *testing.T, gran memapi.Bytes) {
		m := newMech(t, gran)
		s := newStream(t, m)
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 7*gran + 1})
		if err != nil {
			t.Fatal(err)
		}
		if res.Size() != 8*gran || uint64(res.Addr())%uint64(gran) != 0 {
			t.Fatalf("reservation %#x+%d is not rounded and aligned to %d", res.Addr(), res.Size(), gran)
		}
		// Address space only: nothing charged, nothing resident, nothing accessible.
		if m.UsedBytes() != 0 || residentAt(t, m, res.Addr(), res.Size()) != 0 {
			t.Fatal("a fresh reservation holds memory")
		}
		ms := checkNoHole(t, uint64(res.Addr()), uint64(res.Addr())+uint64(res.Size()))
		for _, mp := range ms {
			if mp.perms != "---p" {
				t.Fatalf("fresh reservation is not PROT_NONE: %v", ms)
			}
		}
		commit := func(off, n memapi.Bytes) {
			t.Helper()
			if err := m.Commit(bg, res, memapi.Range{Off: off * gran, Len: n * gran}, g); err != nil {
				t.Fatal(err)
			}
		}
		decommit := func(off, n memapi.Bytes) {
			t.Helper()
			if err := m.Decommit(bg, res, memapi.Range{Off: off * gran, Len: n * gran}, g); err != nil {
				t.Fatal(err)
			}
		}
		wantCommitted := func(n memapi.Bytes) {
			t.Helper()
			c, err := m.CommittedBytes(res)
			if err != nil {
				t.Fatal(err)
			}
			if c != n*gran || m.UsedBytes() != n*gran {
				t.Fatalf("CommittedBytes = %d, UsedBytes = %d, want %d", c, m.UsedBytes(), n*gran)
			}
			if r := residentAt(t, m, res.Addr(), res.Size()); r != n*gran {
				t.Fatalf("mincore reports %d bytes resident, want %d", r, n*gran)
			}
			checkKernel(t, m)
		}
		commit(1, 2) // [1,3)
		wantCommitted(2)
		commit(4, 1) // [1,3) [4,5)
		commit(3, 1) // [1,5), merged
		wantCommitted(4)

		// Data written by one holder...
		at := res.Addr() + memapi.DeviceAddr(gran)
		secret := pattern(4*gran, 9)
		if err := write(s, at, secret); err != nil {
			t.Fatal(err)
		}
		if got := read(t, s, at, 4*gran); !bytes.Equal(got, secret) {
			t.Fatal("committed memory does not hold what was written")
		}
		// ...is gone when the range is decommitted and committed again by the next.
		decommit(2, 2) // [1,2) [4,5)
		wantCommitted(2)
		if err := write(s, at+memapi.DeviceAddr(gran), []byte{1}); err == nil {
			t.Fatal("a copy into a decommitted range succeeded")
		}
		commit(2, 2)
		wantCommitted(4)
		got := read(t, s, at, 4*gran)
		if !bytes.Equal(got[:gran], secret[:gran]) || !bytes.Equal(got[3*gran:], secret[3*gran:]) {
			t.Fatal("chunks that stayed committed lost their data")
		}
		if !allZero(got[gran : 3*gran]) {
			t.Fatal("recommitted memory leaks the previous holder's data")
		}
		decommit(1, 4)
		wantCommitted(0)
		for _, mp := range checkNoHole(t, uint64(res.Addr()), uint64(res.Addr())+uint64(res.Size())) {
			if mp.perms != "---p" {
				t.Fatalf("decommitted reservation is not PROT_NONE again: %v", mp)
			}
		}
		commit(0, 8)
		wantCommitted(8)
		if err := m.ReleaseReservation(bg, res, g); err != nil {
			t.Fatal(err)
		}
		if m.UsedBytes() != 0 || res.Live() {
			t.Fatal("ReleaseReservation did not free what was committed")
		}
		checkKernel(t, m)
	})
}

func TestReservationBadInput(t *testing.T) {
	granularities(t, func(t *testing.T, gran memapi.Bytes) {
		m := newMech(t, gran)
		other := newMech(t, gran)
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * gran})
		if err != nil {
			t.Fatal(err)
		}
		foreign, err := other.Reserve(bg, memapi.ReserveRequest{Size: gran})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(bg, res, memapi.Range{Off: gran, Len: gran}, g); err != nil {
			t.Fatal(err)
		}
		ps := memapi.Bytes(pageSize)
		rg := func(off, n memapi.Bytes) memapi.Range { return memapi.Range{Off: off, Len: n} }
		for _, tc := range []struct {
			name string
			call func() error
			kind error
		}{
			{"reserve/zero", func() error { _, err := m.Reserve(bg, memapi.ReserveRequest{}); return err }, memapi.ErrInvalidSize},
			{"reserve/absurd", func() error { _, err := m.Reserve(bg, memapi.ReserveRequest{Size: 1 << 62}); return err }, memapi.ErrInvalidSize},
			{"reserve/overflow", func() error { _, err := m.Reserve(bg, memapi.ReserveRequest{Size: ^memapi.Bytes(0)}); return err }, memapi.ErrInvalidSize},
			{"commit/no-grant", func() error { return m.Commit(bg, res, rg(0, gran), nil) }, memapi.ErrNoGrant},
			{"commit/empty", func() error { return m.Commit(bg, res, rg(0, 0), g) }, memapi.ErrInvalidRange},
			{"commit/outside", func() error { return m.Commit(bg, res, rg(4*gran, gran), g) }, memapi.ErrInvalidRange},
			{"commit/straddles-end", func() error { return m.Commit(bg, res, rg(3*gran, 2*gran), g) }, memapi.ErrInvalidRange},
			{"commit/overflow", func() error { return m.Commit(bg, res, rg(^memapi.Bytes(0)-gran+1, gran), g) }, memapi.ErrInvalidRange},
			{"commit/absurd", func() error { return m.Commit(bg, res, rg(0, 1<<62), g) }, memapi.ErrInvalidRange},
			{"commit/already", func() error { return m.Commit(bg, res, rg(0, 2*gran), g) }, memapi.ErrCommitted},
			{"commit/foreign", func() error { return m.Commit(bg, foreign, rg(0, gran), g) }, memapi.ErrForeignHandle},
			{"commit/nil", func() error { return m.Commit(bg, nil, rg(0, gran), g) }, memapi.ErrNilHandle},
			{"decommit/not-committed", func() error { return m.Decommit(bg, res, rg(2*gran, gran), g) }, memapi.ErrNotCommitted},
			{"decommit/partly-committed", func() error { return m.Decommit(bg, res, rg(gran, 2*gran), g) }, memapi.ErrNotCommitted},
			{"decommit/outside", func() error { return m.Decommit(bg, res, rg(8*gran, gran), g) }, memapi.ErrInvalidRange},
			{"decommit/foreign", func() error { return m.Decommit(bg, foreign, rg(0, gran), g) }, memapi.ErrForeignHandle},
			{"committed/foreign", func() error { _, err := m.CommittedBytes(foreign); return err }, memapi.ErrForeignHandle},
			{"release/foreign", func() error { return m.ReleaseReservation(bg, foreign, g) }, memapi.ErrForeignHandle},
			{"release/nil", func() error { return m.ReleaseReservation(bg, nil, g) }, memapi.ErrNilHandle},
		} {
			t.Run(tc.name, func(t *testing.T) {
				wantKind(t, tc.call(), tc.kind)
				if c, _ := m.CommittedBytes(res); c != gran || m.UsedBytes() != gran {
					t.Fatalf("a rejected call changed state: committed %d, used %d", c, m.UsedBytes())
				}
				checkKernel(t, m)
			})
		}
		if gran > ps {
			for _, r := range []memapi.Range{rg(ps, gran), rg(0, gran+ps), rg(2*gran, ps)} {
				wantKind(t, m.Commit(bg, res, r, g), memapi.ErrUnaligned)
				wantKind(t, m.Decommit(bg, res, r, g), memapi.ErrUnaligned)
			}
		}
		if err := m.ReleaseReservation(bg, res, g); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{
			m.ReleaseReservation(bg, res, g),
			m.Commit(bg, res, rg(0, gran), g),
			m.Decommit(bg, res, rg(gran, gran), g),
			func() error { _, err := m.CommittedBytes(res); return err }(),
		} {
			wantKind(t, err, memapi.ErrReleased)
		}
		if err := other.ReleaseReservation(bg, foreign, g); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReservationHugePages checks the THP advice: with a 2 MiB granularity
// the reservation is marked for huge pages (where the kernel has THP).
func TestReservationHugePages(t *testing.T) {
	m := newMech(t, Granularity2MiB)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, g)
	if err := m.Commit(bg, res, memapi.Range{Off: 0, Len: 2 * mib}, g); err != nil {
		t.Fatal(err)
	}
	flags, err := smapsField(uint64(res.Addr()), "VmFlags")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	if !contains(flags, "hg") {
		t.Fatalf("reservation VmFlags %q lack hg (MADV_HUGEPAGE)", flags)
	}
	if m4 := newMech(t, Granularity4KiB); m4.huge {
		t.Fatal("a 4 KiB mechanism advises huge pages")
	}
}
