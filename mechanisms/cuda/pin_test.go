package cuda

import (
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// With the device pinned, mechanisms opened and closed one after another
// share one primary context: it is retained once and never destroyed in
// between (gpu-check runs hundreds of mechanisms in one process).
func TestPinnedDeviceKeepsContext(t *testing.T) {
	simOnly(t)
	sim := cudasim.New(cudasim.Config{})
	tbl := sim.Table() // a device is one driver table and one ordinal
	pin, err := PinDevice(Config{Driver: tbl})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		m, err := New(Config{Driver: tbl})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if st := sim.Stats(); st.ContextRefs != 1 {
			t.Fatalf("after mechanism %d closed: %d primary-context references, want the pin's 1", i, st.ContextRefs)
		}
	}
	if n := sim.Calls("cuDevicePrimaryCtxRetain"); n != 1 {
		t.Errorf("cuDevicePrimaryCtxRetain called %d times, want 1", n)
	}
	if err := pin.Close(); err != nil {
		t.Fatal(err)
	}
	_ = pin.Close()
	if st := sim.Stats(); st.ContextRefs != 0 {
		t.Errorf("after the pin closed: %d primary-context references", st.ContextRefs)
	}
}
