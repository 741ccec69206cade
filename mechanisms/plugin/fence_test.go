package plugin

import (
	"runtime"
	"testing"
	"time"

	"github.com/ebitengine/purego"

	"github.com/memgen/memgen/generated/memapi"
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

// TestRefhostSpareBound: the reference plugin keeps freed objects for reuse,
// at most 64 per instance (MAX_SPARE), so a burst of allocations does not
// leave the instance holding all their records.
func TestRefhostSpareBound(t *testing.T) {
	path := refhost(t)
	m, _ := newSubject(t, path)
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	count, err := purego.Dlsym(h, "refhost_count")
	if err != nil {
		t.Fatal(err)
	}
	var as []*memapi.Allocation
	for range 100 {
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, a)
	}
	for _, a := range as {
		if err := m.Free(bg, a, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := callC(count, m.inst, 0); err != nil || r != 64 {
		t.Errorf("after 100 allocations freed refhost keeps %d objects for reuse (%v), want 64", r, err)
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := callC(count, m.inst, 0); r != 63 {
		t.Errorf("an allocation took no kept object: %d kept, want 63", r)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
}
