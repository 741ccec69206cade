package fakestest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

func TestAutomaticFencesAreCompleteAtRecord(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s := stream(t, c)
	ok(t, s.CopyToDevice(a.Addr(), []byte{1, 2, 3}))
	f, err := s.Record()
	ok(t, err)
	if !f.Done() {
		t.Fatal("automatic fence not done at Record")
	}
	select {
	case <-f.Ready():
	default:
		t.Fatal("Ready not closed")
	}
	ok(t, f.Wait(bg))
	if c.Device() != m.Info().Device {
		t.Fatal("context device differs from the mechanism's")
	}
}

func TestFenceCarriesTheErrorOfItsWork(t *testing.T) {
	_, c, _, _ := newFake(t, fakes.Config{})
	s := stream(t, c)
	ok(t, s.CopyToDevice(0x10, []byte{1})) // no memory there: fails at run time, not at enqueue
	f, err := s.Record()
	ok(t, err)
	is(t, f.Wait(bg), memapi.ErrInvalidRange)
	is(t, s.Synchronize(bg), memapi.ErrInvalidRange)
	ok(t, s.Synchronize(bg)) // reported once
}

func TestManualFences(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	c.SetManualFences(true)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s := stream(t, c)
	ok(t, s.CopyToDevice(a.Addr(), []byte{7}))
	f1, err := s.Record()
	ok(t, err)
	ok(t, s.CopyToDevice(a.Addr()+1, []byte{8}))
	f2, err := s.Record()
	ok(t, err)

	peek := func() []byte {
		p := make([]byte, 2)
		ok(t, m.ReadMemory(a.Addr(), p))
		return p
	}
	if f1.Done() || f2.Done() {
		t.Fatal("manual fence done before Complete")
	}
	eq(t, peek(), []byte{0, 0}) // the work waits too
	short, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	if err := f1.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a pending fence: %v, want deadline exceeded", err)
	}

	f2.(*fakes.Fence).Complete()
	if !f1.Done() || !f2.Done() {
		t.Fatal("completing a fence did not complete the fences before it")
	}
	eq(t, peek(), []byte{7, 8})
	f2.(*fakes.Fence).Complete() // idempotent
}

func TestManualCompleteRunsOnlyWorkBeforeTheFence(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	c.SetManualFences(true)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s := stream(t, c)
	ok(t, s.CopyToDevice(a.Addr(), []byte{1}))
	f, err := s.Record()
	ok(t, err)
	ok(t, s.CopyToDevice(a.Addr()+1, []byte{2}))
	f.(*fakes.Fence).Complete()
	p := make([]byte, 2)
	ok(t, m.ReadMemory(a.Addr(), p))
	eq(t, p, []byte{1, 0})
	c.CompleteAll()
	ok(t, m.ReadMemory(a.Addr(), p))
	eq(t, p, []byte{1, 2})
}

func TestManualSynchronizeWaitsForCompletion(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	c.SetManualFences(true)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s := stream(t, c)
	ok(t, s.CopyToDevice(a.Addr(), []byte{5}))

	short, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	if err := s.Synchronize(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Synchronize with pending work: %v, want deadline exceeded", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	done := make(chan error, 1)
	go func() {
		defer wg.Done()
		done <- s.Synchronize(bg)
	}()
	c.CompleteAll()
	ok(t, <-done)
	wg.Wait()
	p := make([]byte, 1)
	ok(t, m.ReadMemory(a.Addr(), p))
	eq(t, p, []byte{5})
}

func TestManualWorkSeesStateAtRunTime(t *testing.T) {
	// A free enqueued before the fence completes turns the copy into a
	// use-after-free: the error deferred-free ordering exists to prevent.
	m, c, g, acct := newFake(t, fakes.Config{})
	c.SetManualFences(true)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s := stream(t, c)
	ok(t, s.CopyToDevice(a.Addr(), []byte{1}))
	f, err := s.Record()
	ok(t, err)
	ok(t, m.Free(bg, a, acct))
	f.(*fakes.Fence).Complete()
	is(t, f.Wait(bg), memapi.ErrInvalidRange)
}

func TestSwitchingBackToAutomaticKeepsOrder(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	c.SetManualFences(true)
	s := stream(t, c)
	ok(t, s.CopyToDevice(a.Addr(), []byte{1}))
	c.SetManualFences(false)
	ok(t, s.CopyToDevice(a.Addr(), []byte{2})) // runs the waiting copy first
	ok(t, s.Synchronize(bg))
	p := make([]byte, 1)
	ok(t, m.ReadMemory(a.Addr(), p))
	eq(t, p, []byte{2})
}

func TestPollOnlyFences(t *testing.T) {
	_, c, _, _ := newFake(t, fakes.Config{})
	c.SetPollOnlyFences(true)
	c.SetManualFences(true)
	s := stream(t, c)
	f, err := s.Record()
	ok(t, err)
	if f.Ready() != nil {
		t.Fatal("poll-only fence returned a channel")
	}
	if f.Done() {
		t.Fatal("done before Complete")
	}
	c.CompleteAll()
	if !f.Done() {
		t.Fatal("not done after CompleteAll")
	}
	ok(t, f.Wait(bg))
}

func TestStreamAndContextClose(t *testing.T) {
	m, _, g, _ := newFake(t, fakes.Config{})
	c := fakes.NewContext(m)
	c.SetManualFences(true)
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s, err := c.NewStream()
	ok(t, err)
	ok(t, s.CopyToDevice(a.Addr(), []byte{9}))
	f, err := s.Record()
	ok(t, err)
	is(t, c.Close(), memapi.ErrInUse)
	ok(t, s.Close()) // runs what waits
	if !f.Done() {
		t.Fatal("Close left a fence pending")
	}
	p := make([]byte, 1)
	ok(t, m.ReadMemory(a.Addr(), p))
	eq(t, p, []byte{9})
	ok(t, s.Close())
	is(t, s.CopyToDevice(a.Addr(), p), memapi.ErrClosed)
	is(t, s.Synchronize(bg), memapi.ErrClosed)
	_, err = s.Record()
	is(t, err, memapi.ErrClosed)
	ok(t, c.Close())
	ok(t, c.Close())
	_, err = c.NewStream()
	is(t, err, memapi.ErrClosed)
}

func TestContextFaults(t *testing.T) {
	m, c, g, _ := newFake(t, fakes.Config{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	c.Inject(fakes.Fault{Method: "CopyToDevice", Nth: 2, Err: memapi.ErrUnavailable})
	c.Inject(fakes.Fault{Method: "Wait", Err: memapi.ErrClosed})
	s1 := stream(t, c)
	s2 := stream(t, c)
	ok(t, s1.CopyToDevice(a.Addr(), []byte{1}))
	is(t, s2.CopyToDevice(a.Addr(), []byte{2}), memapi.ErrUnavailable) // Nth counts across the context's streams
	ok(t, s2.Synchronize(bg))
	p := make([]byte, 1)
	ok(t, m.ReadMemory(a.Addr(), p))
	eq(t, p, []byte{1}) // the faulted copy was never enqueued
	f, err := s1.Record()
	ok(t, err)
	is(t, f.Wait(bg), memapi.ErrClosed)
	if s2.(*fakes.Stream).CopyToDeviceCallCount() != 1 {
		t.Fatal("per-stream call count")
	}
}
