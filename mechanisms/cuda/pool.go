package cuda

import (
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// The pool keeps up to poolMax granularity-sized physical handles created in
// advance (New) or recycled (Decommit, ReleaseBacking), so that growth does
// not pay cuMemCreate, the slow VMM call, each time. Pooled memory reaches a
// caller only after it is cleared (Commit clears with cuMemsetD8, a backing
// before its first view), since a recycled handle holds its last user's bytes.
//
// All pool functions run with m.mu held, on the device thread.

// chunkHandle returns a granularity-sized handle: from the pool, or new.
// The step is undone (back to the pool, or cuMemRelease) on rollback.
func (m *Mechanism) chunkHandle(x *txn) (driver.MemHandle, error) {
	if n := len(m.pool); n > 0 {
		h := m.pool[n-1]
		m.pool = m.pool[:n-1]
		m.pooled.Add(^(m.gran - 1))
		x.onRollback(func() { m.pool = append(m.pool, h); m.pooled.Add(m.gran) })
		return h, nil
	}
	return m.createHandle(x, m.gran)
}

// createHandle makes a handle of size bytes with cuMemCreate.
func (m *Mechanism) createHandle(x *txn, size uint64) (driver.MemHandle, error) {
	var h driver.MemHandle
	t := x.t
	if err := x.step("cuMemCreate", t.MemCreate(&h, size, &m.prop, 0), func() {
		x.quiet("cuMemRelease", t.MemRelease(h))
	}); err != nil {
		return 0, err
	}
	return h, nil
}

// recycle returns a handle of size bytes that no longer has mappings: into
// the pool when it is one chunk and the pool has room, else cuMemRelease.
// A handle the driver refuses to release is kept (m.stuck, counted in
// PooledBytes, retried at Close) rather than forgotten: the memory is still held.
func (m *Mechanism) recycle(t *driver.Table, h driver.MemHandle, size uint64) {
	if size == m.gran && len(m.pool)+m.spares+m.pendings < m.poolMax {
		m.pool = append(m.pool, h)
		m.pooled.Add(size)
		return
	}
	if r := t.MemRelease(h); r != driver.Success {
		m.log.Warn("cuda: cuMemRelease failed; handle kept until Close", "code", t.ErrorName(r), "bytes", size)
		m.stuck = append(m.stuck, h)
		m.pooled.Add(size)
	}
}
