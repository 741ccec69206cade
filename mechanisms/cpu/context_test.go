package cpu

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

func TestStreamOrderAndFences(t *testing.T) {
	m := newMech(t, Granularity4KiB)
	s := newStream(t, m)
	n := 64 * kib
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: n}, g)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free(bg, a, g)
	// Many copies to the same bytes: the last one enqueued wins, and a fence
	// recorded after each completes only once its copy has run.
	var fences []memapi.Fence
	bufs := make([][]byte, 50)
	for i := range bufs {
		bufs[i] = pattern(n, byte(i))
		if err := s.CopyToDevice(a.Addr(), bufs[i]); err != nil {
			t.Fatal(err)
		}
		f, err := s.Record()
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, f)
	}
	got := make([]byte, n)
	if err := s.CopyFromDevice(got, a.Addr()); err != nil {
		t.Fatal(err)
	}
	last, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	ch := last.Ready()
	if ch == nil {
		t.Fatal("Ready() = nil; CPU fences have a channel")
	}
	select {
	case <-ch:
	case <-time.After(watchdog.Bound):
		t.Fatalf("watchdog: the fence did not complete within %v", watchdog.Bound)
	}
	if !last.Done() {
		t.Fatal("Done() false after Ready closed")
	}
	for i, f := range fences {
		if !f.Done() {
			t.Fatalf("fence %d not done after a later fence completed", i)
		}
		if err := f.Wait(bg); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, bufs[len(bufs)-1]) {
		t.Fatal("copies did not run in order")
	}
	// CopyDevice is a memmove: overlapping ranges work.
	if err := s.CopyDevice(a.Addr()+1, a.Addr(), n-1); err != nil {
		t.Fatal(err)
	}
	got2 := read(t, s, a.Addr(), n)
	want := append([]byte{got[0]}, got[:n-1]...)
	if !bytes.Equal(got2, want) {
		t.Fatal("overlapping CopyDevice is not a memmove")
	}
	// Zero-length copies do nothing and fail nothing.
	if err := write(s, 0, nil); err != nil {
		t.Fatal(err)
	}
}

func TestStreamErrors(t *testing.T) {
	m := newMech(t, Granularity4KiB)
	s := newStream(t, m)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 8 * kib}, g)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free(bg, a, g)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 16 * kib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, g)
	wantKind(t, write(s, a.Addr()+memapi.DeviceAddr(a.Size()-1), []byte{1, 2}), memapi.ErrInvalidRange)
	wantKind(t, write(s, 4096, []byte{1}), memapi.ErrInvalidRange)
	wantKind(t, write(s, res.Addr(), []byte{1}), memapi.ErrNotCommitted)
	if err := s.CopyDevice(a.Addr(), res.Addr(), 1); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.Synchronize(bg), memapi.ErrNotCommitted)
	if err := s.CopyDevice(^memapi.DeviceAddr(0), a.Addr(), 2); err != nil {
		t.Fatal(err)
	}
	wantKind(t, s.Synchronize(bg), memapi.ErrInvalidRange)
	// A fence reports the first error since the previous fence only.
	_ = s.CopyToDevice(res.Addr(), []byte{1})
	_ = s.CopyToDevice(5, []byte{1})
	f1, _ := s.Record()
	_ = s.CopyToDevice(a.Addr(), []byte{1})
	f2, _ := s.Record()
	wantKind(t, f1.Wait(bg), memapi.ErrNotCommitted)
	if err := f2.Wait(bg); err != nil {
		t.Fatalf("a fence after good work reports %v", err)
	}
	// Wait honours its context when the fence is not done.
	blocked := &Fence{done: make(chan struct{})}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := blocked.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a cancelled context = %v", err)
	}
}

// TestStreamFaultBackstop changes a committed page's protection behind the
// mechanism's back: the stream's copy faults, and the fault becomes an
// error instead of killing the process.
func TestStreamFaultBackstop(t *testing.T) {
	m := newMech(t, Granularity4KiB)
	s := newStream(t, m)
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 8 * kib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseReservation(bg, res, g)
	if err := m.Commit(bg, res, memapi.Range{Off: 0, Len: 4 * kib}, g); err != nil {
		t.Fatal(err)
	}
	st, _ := m.reservationOf("test", res)
	if err := mprotect(st.ptr, 4096, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	err = write(s, res.Addr(), []byte{1})
	wantKind(t, err, memapi.ErrInvalidRange)
	t.Logf("fault became: %v", err)
	if err := mprotect(st.ptr, 4096, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	if err := write(s, res.Addr(), []byte{1}); err != nil {
		t.Fatal(err)
	}
}

func TestContextLifecycle(t *testing.T) {
	m := newMech(t, Granularity4KiB)
	c := m.NewContext()
	if c.Device() != m.Info().Device {
		t.Fatalf("Device() = %v", c.Device())
	}
	s1, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	wantKind(t, c.Close(), memapi.ErrInUse)
	_ = s1.CopyToDevice(1, []byte{1}) // fails at run time, reported by Close
	wantKind(t, s1.Close(), memapi.ErrInvalidRange)
	if err := s1.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	wantKind(t, s1.CopyToDevice(1, []byte{1}), memapi.ErrClosed)
	_, err = s1.Record()
	wantKind(t, err, memapi.ErrClosed)
	wantKind(t, s1.Synchronize(bg), memapi.ErrClosed)
	wantKind(t, c.Close(), memapi.ErrInUse)
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = c.NewStream()
	wantKind(t, err, memapi.ErrClosed)
	// goleak in TestMain checks that the streams' goroutines are gone.
}

// TestConcurrent drives every capability from several goroutines at once,
// with copies running against the mappings, under -race.
func TestConcurrent(t *testing.T) {
	m := newMech(t, Granularity4KiB)
	c := m.NewContext()
	defer c.Close()
	b, err := m.CreateBacking(bg, 8*kib, g)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			for i := range 20 {
				if err := concurrentRound(m, s, b, byte(w*31+i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := m.ReleaseBacking(bg, b, g); err != nil {
		t.Fatal(err)
	}
	checkKernel(t, m)
}

func concurrentRound(m *Mechanism, s memapi.Stream, b *memapi.Backing, seed byte) error {
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 12 * kib}, g)
	if err != nil {
		return err
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 32 * kib})
	if err != nil {
		return err
	}
	if err := m.Commit(bg, res, memapi.Range{Off: 0, Len: 16 * kib}, g); err != nil {
		return err
	}
	v, err := m.MapView(bg, res, memapi.Range{Off: 16 * kib, Len: 8 * kib}, b, memapi.AccessReadOnly)
	if err != nil {
		return err
	}
	data := pattern(12*kib, seed)
	if err := s.CopyToDevice(a.Addr(), data); err != nil {
		return err
	}
	if err := s.CopyDevice(res.Addr(), a.Addr(), 12*kib); err != nil {
		return err
	}
	got := make([]byte, 12*kib)
	if err := s.CopyFromDevice(got, res.Addr()); err != nil {
		return err
	}
	view := make([]byte, 8*kib)
	if err := s.CopyFromDevice(view, res.Addr()+memapi.DeviceAddr(16*kib)); err != nil {
		return err
	}
	if err := s.Synchronize(bg); err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return errors.New("concurrent copies corrupted data")
	}
	cow, err := m.CopyOnWrite(bg, v, g)
	if err != nil {
		return err
	}
	for _, err := range []error{
		m.UnmapView(bg, cow), m.ReleaseBacking(bg, cow.Backing(), g),
		m.Decommit(bg, res, memapi.Range{Off: 4 * kib, Len: 4 * kib}, g),
		m.ReleaseReservation(bg, res, g), m.Free(bg, a, g),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}
