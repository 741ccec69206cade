package cuda

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// One physical handle mapped at two addresses shows the same bytes, and a
// read-only view refuses writes without the write reaching the driver (where
// it would be a sticky fault). Runs on the real driver with MEMGEN_CUDA=real.
func TestSharedHandleTwoAddresses(t *testing.T) {
	m, sim := newMech(t, cudasim.Config{}, Config{})
	g := memapi.Bytes(m.Info().Granularity)
	gr := grantFor(m)
	s := stream(t, m)
	b, err := m.CreateBacking(bg, g, gr)
	if err != nil {
		t.Fatalf("CreateBacking: %v", err)
	}
	r1, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * g})
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	r2, err := m.Reserve(bg, memapi.ReserveRequest{Size: g})
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	rw, err := m.MapView(bg, r1, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadWrite)
	if err != nil {
		t.Fatalf("MapView rw: %v", err)
	}
	ro, err := m.MapView(bg, r2, memapi.Range{Len: g}, b, memapi.AccessReadOnly)
	if err != nil {
		t.Fatalf("MapView ro: %v", err)
	}
	rwAddr := r1.Addr() + memapi.DeviceAddr(g)
	roAddr := r2.Addr()
	if rwAddr == roAddr {
		t.Fatal("the two views share an address")
	}
	fresh, err := read(t, s, roAddr, int(g))
	if err != nil || !bytes.Equal(fresh, make([]byte, g)) {
		t.Fatalf("a fresh backing does not read zeros (err %v)", err)
	}
	data := pattern(int(g), 3)
	if err := write(t, s, rwAddr, data); err != nil {
		t.Fatalf("write through the read-write view: %v", err)
	}
	got, err := read(t, s, roAddr, int(g))
	if err != nil {
		t.Fatalf("read through the read-only view: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the second address does not show the bytes written at the first")
	}
	err = write(t, s, roAddr+16, []byte{0xFF})
	if !errors.Is(err, memapi.ErrReadOnly) {
		t.Fatalf("write through the read-only view: %v, want ErrReadOnly", err)
	}
	if got, _ := read(t, s, rwAddr+16, 1); got[0] != data[16] {
		t.Errorf("the refused write changed the byte to %#x", got[0])
	}
	if sim != nil && sim.Stats().Sticky != driver.Success {
		t.Errorf("the refused write reached the driver: sticky %v", sim.Stats().Sticky)
	}
	if n, _ := m.ViewCount(b); n != 2 {
		t.Errorf("ViewCount = %d, want 2", n)
	}

	// Copy-on-write gives the read-only view a private, writable copy.
	cow, err := m.CopyOnWrite(bg, ro, gr)
	if err != nil {
		t.Fatalf("CopyOnWrite: %v", err)
	}
	if ro.Live() || !cow.Live() || cow.Access() != memapi.AccessReadWrite {
		t.Fatalf("after CopyOnWrite: old live %v, new live %v access %v", ro.Live(), cow.Live(), cow.Access())
	}
	if got, _ := read(t, s, roAddr, int(g)); !bytes.Equal(got, data) {
		t.Error("the copy does not hold the shared bytes")
	}
	if err := write(t, s, roAddr, []byte{0xEE}); err != nil {
		t.Fatalf("write into the copy: %v", err)
	}
	if got, _ := read(t, s, rwAddr, 1); got[0] != data[0] {
		t.Error("writing the copy changed the shared backing")
	}
	if n, _ := m.ViewCount(b); n != 1 {
		t.Errorf("ViewCount after CopyOnWrite = %d, want 1", n)
	}
	if err := m.ReleaseBacking(bg, b, gr); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("ReleaseBacking with a view: %v, want ErrInUse", err)
	}
	for _, v := range []*memapi.View{rw, cow} {
		if err := m.UnmapView(bg, v); err != nil {
			t.Fatalf("UnmapView: %v", err)
		}
	}
	for _, bb := range []*memapi.Backing{b, cow.Backing()} {
		if err := m.ReleaseBacking(bg, bb, gr); err != nil {
			t.Fatalf("ReleaseBacking: %v", err)
		}
	}
	for _, r := range []*memapi.Reservation{r1, r2} {
		if err := m.ReleaseReservation(bg, r, gr); err != nil {
			t.Fatalf("ReleaseReservation: %v", err)
		}
	}
	if u := m.UsedBytes(); u != 0 {
		t.Errorf("UsedBytes = %d after releasing everything", u)
	}
}

// Growth takes chunks from the pool, with one cuMemSetAccess per Commit;
// decommitted chunks go back to the pool and read zeros when reused.
func TestPoolAndRecycledChunks(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{}, Config{PoolChunks: 4, SpareChunks: -1})
	g := memapi.Bytes(m.Info().Granularity)
	if n := sim.Calls("cuMemCreate"); n != 4 {
		t.Fatalf("New made %d handles, want the 4 of the pool", n)
	}
	if p := m.PooledBytes(); p != 4*g || m.PoolLimit() != 4*g {
		t.Fatalf("PooledBytes %d, PoolLimit %d, want %d", p, m.PoolLimit(), 4*g)
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 8 * g})
	if err != nil {
		t.Fatal(err)
	}
	access := sim.Calls("cuMemSetAccess")
	if err := m.Commit(bg, res, memapi.Range{Len: 3 * g}, grantFor(m)); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if n := sim.Calls("cuMemCreate"); n != 4 {
		t.Errorf("Commit of 3 chunks called cuMemCreate %d times with 4 pooled handles", n-4)
	}
	if n := sim.Calls("cuMemSetAccess") - access; n != 1 {
		t.Errorf("Commit called cuMemSetAccess %d times, want 1 for the whole range", n)
	}
	honest(t, m, sim)
	s := stream(t, m)
	if err := write(t, s, res.Addr(), pattern(int(3*g), 9)); err != nil {
		t.Fatal(err)
	}
	if err := m.Decommit(bg, res, memapi.Range{Len: 3 * g}, grantFor(m)); err != nil {
		t.Fatalf("Decommit: %v", err)
	}
	if p := m.PooledBytes(); p != 4*g {
		t.Errorf("after Decommit PooledBytes = %d, want the pool full again (%d)", p, 4*g)
	}
	honest(t, m, sim)
	// 6 chunks: 4 recycled ones (holding old bytes) and 2 new (poisoned).
	if err := m.Commit(bg, res, memapi.Range{Off: 2 * g, Len: 6 * g}, grantFor(m)); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	got, err := read(t, s, res.Addr()+memapi.DeviceAddr(2*g), int(6*g))
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(got, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Errorf("recommitted memory is not zero at byte %d", i)
	}
	if n := sim.Calls("cuMemCreate"); n != 6 {
		t.Errorf("cuMemCreate called %d times, want 6 (4 pool + 2 beyond it)", n)
	}
	honest(t, m, sim)
	if err := m.ReleaseReservation(bg, res, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	honest(t, m, sim)
}

// honest checks the ledger against the simulated device: every byte the
// device holds is in UsedBytes or the pool.
func honest(t *testing.T, m *Mechanism, sim *cudasim.Sim) {
	t.Helper()
	if used := sim.Stats().Used; used != uint64(m.UsedBytes()+m.PooledBytes()) {
		t.Errorf("device holds %d bytes; UsedBytes %d + PooledBytes %d", used, m.UsedBytes(), m.PooledBytes())
	}
	free, total, err := m.MemInfo(bg)
	if err != nil || total-free != memapi.Bytes(sim.Stats().Used) {
		t.Errorf("MemInfo = %d free of %d (%v); device holds %d", free, total, err, sim.Stats().Used)
	}
}

// The device context refuses copies the driver would fault on, before the
// driver sees them.
func TestCopyGuard(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{}, Config{})
	g := memapi.Bytes(m.Info().Granularity)
	s := stream(t, m)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 100}, grantFor(m))
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * g})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Commit(bg, res, memapi.Range{Len: g}, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	before := sim.Calls("cuMemcpyHtoD")
	cases := []struct {
		name string
		addr memapi.DeviceAddr
		n    int
		want error
	}{
		{"unknown address", 0x1000, 8, memapi.ErrInvalidRange},
		{"past the allocation", a.Addr() + memapi.DeviceAddr(a.Size()) - 4, 8, memapi.ErrInvalidRange},
		{"uncommitted chunk", res.Addr() + memapi.DeviceAddr(g), 8, memapi.ErrNotCommitted},
		{"into the uncommitted chunk", res.Addr() + memapi.DeviceAddr(g) - 4, 8, memapi.ErrNotCommitted},
	}
	for _, tc := range cases {
		if err := write(t, s, tc.addr, make([]byte, tc.n)); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := sim.Calls("cuMemcpyHtoD") - before; n != 0 {
		t.Errorf("%d refused copies reached the driver", n)
	}
	if err := write(t, s, a.Addr()+memapi.DeviceAddr(a.Size())-8, make([]byte, 8)); err != nil {
		t.Errorf("write at the end of the allocation: %v", err)
	}
	if err := m.Free(bg, a, grantFor(m)); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseReservation(bg, res, grantFor(m)); err != nil {
		t.Fatal(err)
	}
}

// Fences complete when the device says: in manual mode, when the test
// completes the events.
func TestFences(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{ManualEvents: true}, Config{})
	s := stream(t, m)
	f, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	if f.Done() {
		t.Fatal("a pending fence reports done")
	}
	if f.Ready() != nil {
		t.Error("Ready is not nil: CUDA fences are poll-only")
	}
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	if err := f.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a pending fence: %v, want the deadline", err)
	}
	done := make(chan error)
	go func() { done <- f.Wait(context.Background()) }() // cuEventSynchronize
	time.Sleep(5 * time.Millisecond)
	if n := sim.CompleteEvents(); n != 1 {
		t.Fatalf("CompleteEvents = %d", n)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if !f.Done() {
		t.Error("a completed fence is not done")
	}
	if st := sim.Stats(); st.Events != 0 {
		t.Errorf("%d events live after the fence completed", st.Events)
	}
	// A fence left pending completes when its stream closes.
	f2, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !f2.Done() || sim.Stats().Events != 0 {
		t.Errorf("after Stream.Close: done %v, events %d", f2.Done(), sim.Stats().Events)
	}
}

// A copy error surfaces at the fences recorded after it and at Synchronize.
func TestCopyErrorReachesFence(t *testing.T) {
	m, _ := newMech(t, cudasim.Config{}, Config{})
	s := stream(t, m)
	if err := s.CopyToDevice(0x10, []byte{1}); err != nil {
		t.Fatalf("CopyToDevice: %v (errors surface later)", err)
	}
	f, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(bg); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("fence after a bad copy: %v, want ErrInvalidRange", err)
	}
	if err := s.Synchronize(bg); !errors.Is(err, memapi.ErrInvalidRange) {
		t.Errorf("Synchronize: %v, want ErrInvalidRange", err)
	}
	if err := s.Synchronize(bg); err != nil {
		t.Errorf("second Synchronize: %v, want nil (the error was reported)", err)
	}
}

func TestOutOfMemoryCarriesFigures(t *testing.T) {
	simOnly(t)
	m, _ := newMech(t, cudasim.Config{Memory: 8 << 20}, Config{PoolChunks: -1})
	held, err := m.Allocate(bg, memapi.AllocRequest{Size: 4 << 20}, grantFor(m))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free(bg, held, grantFor(m))
	_, err = m.Allocate(bg, memapi.AllocRequest{Size: 6 << 20}, grantFor(m))
	var me *memapi.Error
	if !errors.As(err, &me) || me.Kind != memapi.ErrOutOfMemory {
		t.Fatalf("Allocate beyond the device: %v", err)
	}
	if me.Wanted != 6<<20 || me.Available != 4<<20 || me.Authority != "cuda:0" {
		t.Errorf("figures: wanted %d available %d authority %q", me.Wanted, me.Available, me.Authority)
	}
	var de *DriverError
	if !errors.As(err, &de) || de.Call != "cuMemAlloc_v2" || de.Name != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Errorf("cause: %#v", de)
	}
}

func TestAllocateRequests(t *testing.T) {
	m, sim := newMech(t, cudasim.Config{}, Config{AllocGranularity: 4096})
	if ag := m.Info().AllocGranularity; ag != 4096 {
		t.Fatalf("AllocGranularity = %d", ag)
	}
	before := 0
	if sim != nil {
		before = sim.Calls("cuMemAlloc")
	}
	// cuMemAlloc guarantees 256-byte alignment only: more is refused before
	// the driver is asked (the simulator's blocks are 256-aligned and no more).
	for _, req := range []memapi.AllocRequest{{Size: 1, Align: 3}, {Size: 1, Align: 512}, {Size: 1, Align: 4096}, {Size: 0}, {Size: ^memapi.Bytes(0)}} {
		if _, err := m.Allocate(bg, req, grantFor(m)); !errors.Is(err, memapi.ErrInvalidSize) {
			t.Errorf("Allocate(%+v): %v, want ErrInvalidSize", req, err)
		}
	}
	if sim != nil && sim.Calls("cuMemAlloc") != before {
		t.Errorf("refused requests reached cuMemAlloc")
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 5000, Align: 256}, grantFor(m))
	if err != nil {
		t.Fatal(err)
	}
	if a.Size() != 8192 || a.Addr()%256 != 0 || m.UsedBytes() != 8192 {
		t.Errorf("allocation %#x size %d, UsedBytes %d", a.Addr(), a.Size(), m.UsedBytes())
	}
	if _, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, nil); !errors.Is(err, memapi.ErrNoGrant) {
		t.Errorf("Allocate without a grant: %v", err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(bg, a, nil); !errors.Is(err, memapi.ErrReleased) {
		t.Errorf("second Free: %v, want ErrReleased", err)
	}
	if _, err := New(Config{Driver: cudasim.New(cudasim.Config{}).Table(), AllocGranularity: 1000}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("New with granularity 1000: %v", err)
	}
}

func TestWithoutVMM(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{NoVMM: true}, Config{})
	if caps := memapi.Negotiate(m); caps != memapi.Of(memapi.CapDeviceAllocator) {
		t.Errorf("capabilities without VMM: %v", caps)
	}
	if _, err := memapi.RequireVirtualBacking(m); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("RequireVirtualBacking: %v", err)
	}
	if n := sim.Calls("cuMemCreate"); n != 0 || m.PooledBytes() != 0 {
		t.Errorf("a device without VMM got a pool: %d handles", n)
	}
}

// Mechanisms on one device share its thread and primary context.
func TestDeviceShared(t *testing.T) {
	simOnly(t)
	sim := cudasim.New(cudasim.Config{})
	m1, err := New(Config{Driver: sim.Table(), PoolChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	m2, err := New(Config{Driver: m1.dev.t, PoolChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	if m1.dev != m2.dev || sim.Calls("cuInit") != 1 || sim.Stats().ContextRefs != 1 {
		t.Errorf("two mechanisms: shared %v, cuInit %d, context refs %d", m1.dev == m2.dev, sim.Calls("cuInit"), sim.Stats().ContextRefs)
	}
	if m1.Info().Instance == m2.Info().Instance {
		t.Error("two mechanisms share an instance id")
	}
	_ = m1.Close()
	if sim.Stats().ContextRefs != 1 {
		t.Error("closing one mechanism released the shared context")
	}
	_ = m2.Close()
	if sim.Stats().ContextRefs != 0 {
		t.Error("closing both mechanisms left the context retained")
	}
}

// Close frees what is still live, reports it, and leaves nothing on the device.
func TestCloseReleasesAndReports(t *testing.T) {
	simOnly(t)
	sim := cudasim.New(cudasim.Config{})
	m, err := New(Config{Driver: sim.Table()})
	if err != nil {
		t.Fatal(err)
	}
	g := memapi.Bytes(m.Info().Granularity)
	gr := grantFor(m)
	a, _ := m.Allocate(bg, memapi.AllocRequest{Size: 1}, gr)
	res, _ := m.Reserve(bg, memapi.ReserveRequest{Size: 3 * g})
	_ = m.Commit(bg, res, memapi.Range{Len: g}, gr)
	b, _ := m.CreateBacking(bg, g, gr)
	v, err := m.MapView(bg, res, memapi.Range{Off: g, Len: g}, b, memapi.AccessReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := m.NewContext()
	s, _ := c.NewStream()
	f, _ := s.Record()
	err = m.Close()
	if !errors.Is(err, memapi.ErrInUse) {
		t.Fatalf("Close with live handles: %v, want ErrInUse", err)
	}
	t.Logf("Close: %v", err)
	for _, h := range []memapi.Handle{a, res, b, v} {
		if h.Live() {
			t.Errorf("%v still live after Close", h)
		}
	}
	if st := sim.Stats(); st.Used != 0 || st.Handles != 0 || st.Mappings != 0 || st.Reservations != 0 ||
		st.Blocks != 0 || st.Streams != 0 || st.Events != 0 || st.ContextRefs != 0 {
		t.Errorf("device after Close: %+v", st)
	}
	if !f.Done() {
		t.Error("a fence of a closed device is not done")
	}
	if _, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, gr); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("Allocate after Close: %v", err)
	}
	if err := s.CopyToDevice(0, []byte{1}); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("copy after Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestContextRules(t *testing.T) {
	m, _ := newMech(t, cudasim.Config{}, Config{})
	c, err := m.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	if c.Device() != (memapi.DeviceKey{Kind: memapi.DeviceKindCUDA}) {
		t.Errorf("Device = %+v", c.Device())
	}
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, memapi.ErrInUse) {
		t.Errorf("Close with an open stream: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Stream.Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewStream(); !errors.Is(err, memapi.ErrClosed) {
		t.Errorf("NewStream after Close: %v", err)
	}
}

// A size beyond the device's memory is out of memory with the figures,
// refused before the driver, which may answer it with INVALID_VALUE.
func TestBeyondDeviceMemory(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{Memory: 64 << 20}, Config{})
	for _, call := range []string{"cuMemCreate", "cuMemAlloc"} {
		sim.FailCall(call, 1, driver.ErrInvalidValue) // what a driver may say to 1<<62
	}
	_, err := m.CreateBacking(bg, 1<<62, grantFor(m))
	var me *memapi.Error
	if !errors.As(err, &me) || me.Kind != memapi.ErrOutOfMemory || me.Wanted != 1<<62 || me.Available != 64<<20 {
		t.Errorf("CreateBacking(1<<62): %v, want ErrOutOfMemory wanting 1<<62 of 64 MiB", err)
	}
	if _, err := m.Allocate(bg, memapi.AllocRequest{Size: 1 << 62}, grantFor(m)); !errors.Is(err, memapi.ErrOutOfMemory) {
		t.Errorf("Allocate(1<<62): %v, want ErrOutOfMemory", err)
	}
	if n := sim.Calls("cuMemCreate") + sim.Calls("cuMemAlloc"); n != DefaultPoolChunks {
		t.Errorf("%d driver allocations, want only the pool's %d", n, DefaultPoolChunks)
	}
}
