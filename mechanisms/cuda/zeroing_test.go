package cuda

import (
	"bytes"
	"testing"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// nonBlockingRead reads n bytes at addr from a CU_STREAM_NON_BLOCKING stream,
// as an execution provider's kernel on such a stream would: that stream does
// not wait for the legacy stream's work.
func nonBlockingRead(t *testing.T, m *Mechanism, addr memapi.DeviceAddr, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	err := m.dev.do(func(tb *driver.Table) error {
		var st driver.Stream
		if err := check(tb, "cuStreamCreate", tb.StreamCreate(&st, driver.StreamNonBlocking)); err != nil {
			return err
		}
		defer tb.StreamDestroy(st)
		return check(tb, "cuMemcpyDtoHAsync_v2", tb.MemcpyDtoHAsync(unsafe.Pointer(&buf[0]), driver.DevicePtr(addr), uint64(n), st))
	})
	if err != nil {
		t.Fatalf("reading from a non-blocking stream: %v", err)
	}
	return buf
}

// Commit and a backing's first view return only once their clearing is
// done, so work on a non-blocking stream, which is not ordered after the
// legacy stream's cuMemsetD8, reads zeros and its writes are not cleared
// afterwards: for fresh chunks, pooled ones, a spare, and a view.
func TestZeroingOrderedForNonBlockingStreams(t *testing.T) {
	m, _ := newMech(t, cudasim.Config{Granularity: 64 << 10}, Config{})
	g := m.Info().Granularity
	gr := grantFor(m)
	s := stream(t, m)
	zeros := make([]byte, g)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 16 * g})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, gr)
	check := func(what string, addr memapi.DeviceAddr) {
		t.Helper()
		if got := nonBlockingRead(t, m, addr, int(g)); !bytes.Equal(got, zeros) {
			i := bytes.IndexFunc(got, func(r rune) bool { return r != 0 })
			t.Errorf("%s: a non-blocking stream reads %#x at byte %d, want zeros", what, got[i], i)
		}
	}
	// Chunks 0-5 from the pool and cuMemCreate.
	if err := m.Commit(bg, res, memapi.Range{Len: 6 * g}, gr); err != nil {
		t.Fatal(err)
	}
	check("Commit, first chunk", res.Addr())
	check("Commit, last chunk", res.Addr()+memapi.DeviceAddr(5*g))
	// Dirty chunk 5, give it back (it stays mapped as a spare) and commit
	// it again: its old bytes are cleared.
	if err := write(t, s, res.Addr()+memapi.DeviceAddr(5*g), pattern(int(g), 3)); err != nil {
		t.Fatal(err)
	}
	if err := m.Decommit(bg, res, memapi.Range{Off: 5 * g, Len: g}, gr); err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(bg, res, memapi.Range{Off: 5 * g, Len: g}, gr); err != nil {
		t.Fatal(err)
	}
	check("Commit of a dirty spare", res.Addr()+memapi.DeviceAddr(5*g))
	m.quiesce()
	if err := m.Commit(bg, res, memapi.Range{Off: 6 * g, Len: g}, gr); err != nil {
		t.Fatal(err)
	}
	check("Commit of the refiller's spare", res.Addr()+memapi.DeviceAddr(6*g))
	b, err := m.CreateBacking(bg, 2*g, gr)
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.MapView(bg, res, memapi.Range{Off: 8 * g, Len: 2 * g}, b, memapi.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	check("first view of a backing", res.Addr()+memapi.DeviceAddr(9*g))
	if err := m.UnmapView(bg, v); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseBacking(bg, b, gr); err != nil {
		t.Fatal(err)
	}
}

// On a GPU the clear is still running when Commit or MapView first queries
// its event: they poll until it completes, leaving the device thread free,
// and only then return (the simulator in manual mode holds the event, as a
// busy GPU would).
func TestZeroingWaitsForTheClear(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{ManualEvents: true, Granularity: 64 << 10}, Config{SpareChunks: -1})
	g := m.Info().Granularity
	gr := grantFor(m)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 4 * g})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, gr)
	b, err := m.CreateBacking(bg, g, gr)
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseBacking(bg, b, gr)
	var view *memapi.View
	defer func() {
		if view != nil {
			_ = m.UnmapView(bg, view)
		}
	}()
	for _, op := range []struct {
		name string
		run  func() error
		at   memapi.DeviceAddr
	}{
		{"Commit", func() error { return m.Commit(bg, res, memapi.Range{Len: g}, gr) }, res.Addr()},
		{"MapView", func() error {
			var err error
			view, err = m.MapView(bg, res, memapi.Range{Off: 2 * g, Len: g}, b, memapi.AccessReadOnly)
			return err
		}, res.Addr() + memapi.DeviceAddr(2*g)},
	} {
		queries := sim.Calls("cuEventQuery")
		done := make(chan error, 1)
		go func() { done <- op.run() }()
		for deadline := time.Now().Add(10 * time.Second); sim.Calls("cuEventQuery") < queries+3; {
			select {
			case err := <-done:
				t.Fatalf("%s returned (%v) while its clear's event was pending", op.name, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s made %d event queries in 10 s, want it polling", op.name, sim.Calls("cuEventQuery")-queries)
			}
			time.Sleep(time.Millisecond)
		}
		if _, _, err := m.MemInfo(bg); err != nil {
			t.Errorf("MemInfo while %s waits: %v", op.name, err)
		}
		sim.CompleteEvents()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
		case <-time.After(watchdog.Bound):
			t.Fatalf("watchdog: %s did not return %v after its clear completed", op.name, watchdog.Bound)
		}
		if got := nonBlockingRead(t, m, op.at, int(g)); !bytes.Equal(got, make([]byte, g)) {
			t.Errorf("after %s: a non-blocking stream does not read zeros", op.name)
		}
	}
}
