package cuda

import (
	"context"
	"errors"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// TestCancelledContextChangesNothing: an Allocate or a Free whose context
// is already cancelled fails with the context's error and makes no driver
// call: nothing is allocated, and the allocation stays live and freeable.
func TestCancelledContextChangesNothing(t *testing.T) {
	simOnly(t)
	m, sim := newMech(t, cudasim.Config{}, Config{})
	done, cancel := context.WithCancel(context.Background())
	cancel()

	before := sim.Stats()
	if a, err := m.Allocate(done, memapi.AllocRequest{Size: 1 << 20}, grantFor(m)); a != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Allocate with a cancelled context: %v, %v", a, err)
	}
	if got := sim.Stats(); got.Blocks != before.Blocks || got.Used != before.Used || m.UsedBytes() != 0 {
		t.Fatalf("the refused Allocate allocated: %+v -> %+v, mechanism %d", before, got, m.UsedBytes())
	}

	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 1 << 20}, grantFor(m))
	if err != nil {
		t.Fatal(err)
	}
	held := sim.Stats()
	if err := m.Free(done, a, grantFor(m)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Free with a cancelled context: %v", err)
	}
	if got := sim.Stats(); !a.Live() || got.Blocks != held.Blocks || got.Used != held.Used || m.UsedBytes() != memapi.Bytes(a.Size()) {
		t.Fatalf("the refused Free freed: live %v, %+v -> %+v", a.Live(), held, got)
	}
	if err := m.Free(bg, a, grantFor(m)); err != nil {
		t.Fatalf("the Free after it: %v", err)
	}
	if got := sim.Stats(); got.Blocks != before.Blocks || m.UsedBytes() != 0 {
		t.Fatalf("after the Free: %+v, mechanism %d", got, m.UsedBytes())
	}
}
