package fakestest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

// TestConcurrentUse runs allocation, commit, views, copies, recording and
// fault injection from many goroutines at once (meaningful under -race) and
// checks that the accounting ends where it started.
func TestConcurrentUse(t *testing.T) {
	rec := fakes.NewRecorder()
	m, c, g, acct := newFake(t, fakes.Config{Recorder: rec})
	shared, err := m.CreateBacking(bg, g64, g)
	ok(t, err)
	const workers, rounds = 8, 20
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- worker(m, c, g, acct, shared, byte(w), rounds)
		}()
	}
	wg.Add(1)
	go func() { // meanwhile, a test thread plays with faults and stubs
		defer wg.Done()
		for range rounds {
			m.Inject(fakes.Fault{Method: "ViewCount", Err: memapi.ErrUnavailable})
			m.ClearFaults()
			_ = m.AllocateCallCount()
			_ = rec.Calls()
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		ok(t, err)
	}
	ok(t, m.ReleaseBacking(bg, shared, acct))
	used(t, m, 0)
	if m.LiveHandles() != 0 {
		t.Fatalf("LiveHandles = %d", m.LiveHandles())
	}
	if n := m.AllocateCallCount(); n != workers*rounds {
		t.Fatalf("AllocateCallCount = %d, want %d", n, workers*rounds)
	}
}

func worker(m *fakes.Mechanism, c *fakes.Context, g memapi.Grant, acct memapi.Account, shared *memapi.Backing, id byte, rounds int) error {
	s, err := c.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	for i := range rounds {
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 1000}, g)
		if err != nil {
			return err
		}
		res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * g64})
		if err != nil {
			return err
		}
		if err := m.Commit(bg, res, memapi.Range{Len: g64}, g); err != nil {
			return err
		}
		v, err := m.MapView(bg, res, memapi.Range{Off: g64, Len: g64}, shared, memapi.AccessReadOnly)
		if err != nil {
			return err
		}
		want := []byte{id, byte(i), 0xAB}
		_ = s.CopyToDevice(a.Addr(), want)
		_ = s.CopyDevice(res.Addr(), a.Addr(), 3)
		got := make([]byte, 3)
		_ = s.CopyFromDevice(got, res.Addr())
		if err := s.Synchronize(bg); err != nil {
			return err
		}
		if string(got) != string(want) {
			return fmt.Errorf("worker %d round %d read %x, want %x", id, i, got, want)
		}
		if _, err := m.ViewCount(shared); err != nil && !isInjected(err) {
			return err
		}
		for _, step := range []func() error{
			func() error { return m.UnmapView(bg, v) },
			func() error { return m.ReleaseReservation(bg, res, acct) },
			func() error { return m.Free(bg, a, acct) },
		} {
			if err := step(); err != nil {
				return err
			}
		}
	}
	return nil
}

func isInjected(err error) bool {
	me, ok := err.(*memapi.Error)
	return ok && me.Kind == memapi.ErrUnavailable
}
