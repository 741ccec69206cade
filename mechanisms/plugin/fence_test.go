package plugin

import (
	"runtime"
	"testing"
	"time"

	"github.com/ebitengine/purego"
)

// kindFence is refhost's object kind of fences (enum kind in refhost.c).
const kindFence = 6

// TestFencesReleased: a fence the program drops is released in the plugin
// (fence_release from the Go fence's cleanup), so fences do not pile up.
func TestFencesReleased(t *testing.T) {
	path := refhost(t)
	m, c := newSubject(t, path)
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	count, err := purego.Dlsym(h, "refhost_count")
	if err != nil {
		t.Fatal(err)
	}
	fences := func() uint64 {
		r, err := callC(count, m.inst, kindFence)
		if err != nil {
			t.Fatal(err)
		}
		return uint64(r)
	}
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 64
	for range n {
		f, err := s.Record()
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Wait(bg); err != nil {
			t.Fatal(err)
		}
	}
	if got := fences(); got == 0 || got > n {
		t.Fatalf("%d fences live in the plugin after recording %d", got, n)
	}
	// Cleanups run after a collection, on the runtime's schedule: give them
	// a bounded number of collections.
	for i := 0; i < 200 && fences() > 0; i++ {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if got := fences(); got != 0 {
		t.Errorf("%d of %d dropped fences are still live in the plugin", got, n)
	}
}
