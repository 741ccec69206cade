package cuda

import (
	"testing"
	"time"

	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// A fence's Wait with a context that never ends (context.Background) does
// not hold the device thread: while it waits for a pending event, other
// driver calls of the device run (here cuMemGetInfo, through MemInfo).
func TestFenceWaitLeavesDeviceThreadFree(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{ManualEvents: true}, Config{})
	s := stream(t, m)
	f, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	queries := sim.Calls("cuEventQuery") + sim.Calls("cuEventSynchronize")
	waited := make(chan error, 1)
	go func() { waited <- f.Wait(bg) }()
	// The Wait has reached the driver once it queried or synchronized the event.
	for deadline := time.Now().Add(10 * time.Second); sim.Calls("cuEventQuery")+sim.Calls("cuEventSynchronize") == queries; {
		if time.Now().After(deadline) {
			t.Fatal("Wait made no driver call in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	info := make(chan error, 1)
	go func() {
		_, _, err := m.MemInfo(bg)
		info <- err
	}()
	infoDone := false
	select {
	case err := <-info:
		infoDone = true
		if err != nil {
			t.Errorf("MemInfo during the Wait: %v", err)
		}
	case <-time.After(watchdog.Bound):
		t.Errorf("watchdog: MemInfo did not return in %v while a fence Wait(context.Background()) was pending: the device thread is held", watchdog.Bound)
	}
	sim.CompleteEvents()
	pending := []chan error{waited}
	if !infoDone {
		pending = append(pending, info)
	}
	for _, ch := range pending {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("after the events completed: %v", err)
			}
		case <-time.After(watchdog.Bound):
			t.Fatalf("watchdog: no return %v after the events completed", watchdog.Bound)
		}
	}
}
