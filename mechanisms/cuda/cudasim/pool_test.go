package cudasim

import (
	"sync"
	"testing"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// countPool is a MemoryPool of a fixed size.
type countPool struct {
	mu         sync.Mutex
	size, used uint64
}

func (p *countPool) Take(n uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > p.size-p.used {
		return false
	}
	p.used += n
	return true
}

func (p *countPool) Give(n uint64) { p.mu.Lock(); p.used -= n; p.mu.Unlock() }
func (p *countPool) Free() uint64  { p.mu.Lock(); defer p.mu.Unlock(); return p.size - p.used }

// Two simulators sharing a pool share its memory: what one holds the other
// cannot allocate, cuMemGetInfo shows the pool's free bytes, and frees,
// releases and a destroyed context give the bytes back.
func TestSharedPool(t *testing.T) {
	pool := &countPool{size: 3 * g}
	a := setup(t, Config{Pool: pool})
	var p1, p2 driver.DevicePtr
	a.must("cuMemAlloc", a.d.MemAlloc(&p1, 2*g))
	var free, total uint64
	a.must("cuMemGetInfo", a.d.MemGetInfo(&free, &total))
	if free != g {
		t.Fatalf("free %d, want the pool's %d", free, g)
	}
	b := setup(t, Config{Pool: pool})
	if r := b.d.MemAlloc(&p2, 2*g); r != driver.ErrOutOfMemory {
		t.Fatalf("second simulator beyond the pool: %v", r)
	}
	h := a.create(g)
	if pool.used != 3*g {
		t.Fatalf("pool used %d", pool.used)
	}
	a.must("cuMemRelease", a.d.MemRelease(h))
	a.must("cuMemFree", a.d.MemFree(p1))
	if pool.used != 0 {
		t.Fatalf("after frees the pool holds %d", pool.used)
	}
}
