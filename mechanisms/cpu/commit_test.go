package cpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

// A Commit populates outside the mechanism's exclusive lock: while one is
// held inside its populate, a copy to another allocation completes, and the
// range being committed is refused to everyone else (another Commit, a view,
// Decommit, a copy). ReleaseReservation waits for the commit to settle. The
// commit is held by a hook, not by timing.
func TestCommitDoesNotBlockOthers(t *testing.T) {
	m := newMech(t, 64*kib)
	s := newStream(t, m)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * mib})
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.Allocate(bg, memapi.AllocRequest{Size: 4 * kib}, g)
	if err != nil {
		t.Fatal(err)
	}
	inside, release := make(chan struct{}), make(chan struct{})
	m.populate = func(p unsafe.Pointer, n uintptr) error {
		close(inside)
		<-release
		return populate(p, n)
	}
	r := memapi.Range{Len: 2 * mib}
	done := make(chan error, 1)
	go func() { done <- m.Commit(bg, res, r, g) }()
	<-inside

	// The commit is inside populate now. A copy elsewhere does not wait for it.
	data := bytes.Repeat([]byte{9}, 4096)
	if err := s.CopyToDevice(other.Addr(), data); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(bg); err != nil {
		t.Fatalf("copy to another allocation during a commit: %v", err)
	}
	// The claimed range is nobody else's.
	if err := m.Commit(bg, res, memapi.Range{Len: 64 * kib}, g); !errors.Is(err, memapi.ErrCommitted) {
		t.Errorf("Commit over a range being committed: %v, want ErrCommitted", err)
	}
	if err := m.Decommit(bg, res, r, g); !errors.Is(err, memapi.ErrNotCommitted) {
		t.Errorf("Decommit of a range being committed: %v, want ErrNotCommitted", err)
	}
	if err := s.CopyToDevice(res.Addr(), data); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(bg); !errors.Is(err, memapi.ErrNotCommitted) {
		t.Errorf("copy into a range being committed: %v, want ErrNotCommitted", err)
	}
	if got := m.UsedBytes(); got != 4*kib {
		t.Errorf("UsedBytes = %d during the commit, want only the allocation's", got)
	}
	// Another range of the same reservation commits meanwhile.
	m.mu.Lock()
	m.populate = populate
	m.mu.Unlock()
	if err := m.Commit(bg, res, memapi.Range{Off: 2 * mib, Len: 64 * kib}, g); err != nil {
		t.Errorf("Commit of a disjoint range during a commit: %v", err)
	}
	released := make(chan error, 1)
	go func() { released <- m.ReleaseReservation(bg, res, g) }()
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the held commit: %v", err)
	}
	if err := <-released; err != nil {
		t.Fatalf("ReleaseReservation after the commit settled: %v", err)
	}
	if err := m.Free(bg, other, g); err != nil {
		t.Fatal(err)
	}
}

// Adjacent commits merge, in the mechanism's extents and in the kernel's
// mappings: growing a reservation page by page keeps its mapping count flat.
func TestAdjacentCommitsMerge(t *testing.T) {
	m := newMech(t, 4*kib)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, g)
	for off := memapi.Bytes(0); off < 256*4*kib; off += 4 * kib {
		if err := m.Commit(bg, res, memapi.Range{Off: off, Len: 4 * kib}, g); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := m.reservationOf("test", res)
	m.mu.RLock()
	extents := len(st.backed)
	m.mu.RUnlock()
	if extents != 1 {
		t.Errorf("%d extents after 256 adjacent commits, want 1", extents)
	}
	if n := mappingsIn(t, uint64(res.Addr()), uint64(res.Size())); n > 2 {
		t.Errorf("%d kernel mappings in the reservation after 256 adjacent commits, want at most 2 (read-write, rest)", n)
	}
}

// mappingsIn counts the lines of /proc/self/maps that overlap [base, base+size).
func mappingsIn(t *testing.T, base, size uint64) int {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lo, hi, ok := strings.Cut(strings.Fields(sc.Text())[0], "-")
		if !ok {
			continue
		}
		a, _ := strconv.ParseUint(lo, 16, 64)
		b, _ := strconv.ParseUint(hi, 16, 64)
		if a < base+size && base < b {
			n++
		}
	}
	return n
}

// TestMapCountExhaustion commits every other page of a reservation in a
// child process until the kernel refuses: the error is ErrOutOfMemory with
// a *MapCountError cause that carries the count and the limit, and the
// commit that failed left nothing behind.
func TestMapCountExhaustion(t *testing.T) {
	if testing.Short() {
		t.Skip("commits about 32,000 pages in a child process")
	}
	if raceEnabled {
		t.Skip("the race detector needs mappings of its own")
	}
	out, st := child(t, "map-count")
	t.Log(out)
	if !st.Success() || !strings.Contains(out, "child: ok") {
		t.Fatalf("child failed (%v):\n%s", st, out)
	}
}

func childMapCount() error {
	limit, ok := maxMapCount()
	if !ok {
		fmt.Println("no vm.max_map_count here")
		return nil
	}
	m, err := New(Options{Granularity: Granularity4KiB})
	if err != nil {
		return err
	}
	page := memapi.Bytes(pageSize)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: memapi.Bytes(limit+16) * 2 * page})
	if err != nil {
		return err
	}
	var commits int
	for off := memapi.Bytes(0); off < res.Size(); off += 2 * page {
		before := m.UsedBytes()
		err = m.Commit(bg, res, memapi.Range{Off: off, Len: page}, g)
		if err == nil {
			commits++
			continue
		}
		var mc *MapCountError
		if !errors.Is(err, memapi.ErrOutOfMemory) || !errors.As(err, &mc) {
			return fmt.Errorf("commit %d: %v, want ErrOutOfMemory caused by a *MapCountError", commits, err)
		}
		if mc.Limit != limit || mc.Count+mapSlack < limit {
			return fmt.Errorf("MapCountError %+v, limit %d", mc, limit)
		}
		if m.UsedBytes() != before {
			return fmt.Errorf("the failed commit changed UsedBytes")
		}
		fmt.Printf("commit %d refused: %v\n", commits, err)
		break
	}
	if err == nil {
		return fmt.Errorf("%d isolated commits never reached vm.max_map_count %d", commits, limit)
	}
	return m.ReleaseReservation(bg, res, g)
}

// TestMapCountAllocatesNothing: the map count is read when the process is
// out of memory mappings, where a heap allocation that needs a new one is
// a fatal error in the runtime (reading /proc/self/maps whole was, about
// one run in twenty of TestMapCountExhaustion).
func TestMapCountAllocatesNothing(t *testing.T) {
	limit, ok := maxMapCount()
	if !ok {
		t.Skip("no vm.max_map_count here")
	}
	want, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		t.Fatal(err)
	}
	if got := strconv.Itoa(limit); got != strings.TrimSpace(string(want)) {
		t.Fatalf("maxMapCount %s, the file says %q", got, want)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	// The count moves as the runtime maps: it must be near the file's.
	if n, ok := mapCount(); !ok || n < 1 || n > limit || n < strings.Count(string(maps), "\n")/2 {
		t.Fatalf("mapCount %d, %v; /proc/self/maps has %d lines", n, ok, strings.Count(string(maps), "\n"))
	}
	if raceEnabled {
		return // the race detector allocates
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = mapCount() }); n != 0 {
		t.Errorf("mapCount allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = maxMapCount() }); n != 0 {
		t.Errorf("maxMapCount allocates %v times", n)
	}
}
