package cuda

import (
	"errors"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Commit makes its driver calls without the mechanism's lock: while one is
// held inside cuMemMap (a wrapped driver table, no timing), calls that need
// the lock return, and the claimed chunks are nobody else's.
func TestCommitOutsideLock(t *testing.T) {
	simOnly(t)
	sim := cudasim.New(cudasim.Config{Granularity: 64 << 10})
	tbl := sim.Table()
	var once sync.Once
	inside, release := make(chan struct{}), make(chan struct{})
	armed := false
	mapCall := tbl.MemMap
	tbl.MemMap = func(ptr driver.DevicePtr, size, off uint64, h driver.MemHandle, flags uint64) driver.Result {
		if armed {
			once.Do(func() { close(inside); <-release })
		}
		return mapCall(ptr, size, off, h, flags)
	}
	m, err := New(Config{Driver: tbl, SpareChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	g := m.Info().Granularity
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g})
	if err != nil {
		t.Fatal(err)
	}
	armed = true
	done := make(chan error, 1)
	go func() { done <- m.Commit(bg, res, memapi.Range{Len: 2 * g}, grantFor(m)) }()
	<-inside
	if n, err := m.CommittedBytes(res); err != nil || n != 0 {
		t.Errorf("CommittedBytes during the commit: %d, %v; want 0", n, err)
	}
	if err := m.Decommit(bg, res, memapi.Range{Len: g}, grantFor(m)); !errors.Is(err, memapi.ErrNotCommitted) {
		t.Errorf("Decommit of a chunk being committed: %v, want ErrNotCommitted", err)
	}
	if u := m.UsedBytes(); u != 0 {
		t.Errorf("UsedBytes = %d during the commit", u)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, _ := m.CommittedBytes(res); n != 2*g {
		t.Errorf("CommittedBytes after the commit: %d", n)
	}
	if err := m.ReleaseReservation(bg, res, grantFor(m)); err != nil {
		t.Fatal(err)
	}
}

// Decommit unmaps without the mechanism's lock too: held inside cuMemUnmap,
// CommittedBytes answers (the chunks count until the Decommit settles) and a
// second Decommit of them is refused.
func TestDecommitOutsideLock(t *testing.T) {
	simOnly(t)
	sim := cudasim.New(cudasim.Config{Granularity: 64 << 10})
	tbl := sim.Table()
	var once sync.Once
	inside, release := make(chan struct{}), make(chan struct{})
	armed := false
	unmapCall := tbl.MemUnmap
	tbl.MemUnmap = func(ptr driver.DevicePtr, size uint64) driver.Result {
		if armed {
			once.Do(func() { close(inside); <-release })
		}
		return unmapCall(ptr, size)
	}
	m, err := New(Config{Driver: tbl, SpareChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	g := m.Info().Granularity
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g})
	if err != nil {
		t.Fatal(err)
	}
	r := memapi.Range{Len: 2 * g}
	if err := m.Commit(bg, res, r, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	armed = true
	done := make(chan error, 1)
	go func() { done <- m.Decommit(bg, res, r, grantFor(m)) }()
	<-inside
	if n, err := m.CommittedBytes(res); err != nil || n != 2*g {
		t.Errorf("CommittedBytes during the decommit: %d, %v; want %d until it settles", n, err, 2*g)
	}
	if err := m.Decommit(bg, res, r, grantFor(m)); !errors.Is(err, memapi.ErrNotCommitted) {
		t.Errorf("a second Decommit of chunks being decommitted: %v, want ErrNotCommitted", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n, _ := m.CommittedBytes(res); n != 0 || m.UsedBytes() != 0 {
		t.Errorf("after the decommit: CommittedBytes %d, UsedBytes %d", n, m.UsedBytes())
	}
	if err := m.ReleaseReservation(bg, res, grantFor(m)); err != nil {
		t.Fatal(err)
	}
}
