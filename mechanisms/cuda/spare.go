package cuda

import (
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Spares are pool chunks kept mapped, with read-write access set, at a
// reservation's chunk that nothing has committed: the chunk just past a
// reservation's growth, where the next Commit of a growing KV cache lands,
// and chunks a Decommit gave back. A Commit of a spare chunk pays one
// cuMemsetD8 (fresh backing reads zeros) instead of cuMemMap and
// cuMemSetAccess, and a Decommit into a spare pays no driver call at all.
// The refiller, one goroutine per mechanism that stops at Close, maps new
// spares off the callers' path and outside m.mu, from the pool or from
// cuMemCreate. Spares are pool bytes: not in UsedBytes, in PooledBytes, and
// with the pool's handles never more than PoolLimit. A copy never reaches a
// spare (the guard treats it as uncommitted), and anything that needs a
// spare's address for something else (a view, the reservation's release)
// unmaps it first.
//
// Chunk states: a spare is chunk{handle, spare}; a chunk the refiller is
// mapping is chunk{pending} (Commit, MapView and ReleaseReservation wait for
// it to settle, on m.settled).

// DefaultSpareChunks is how many spares a mechanism keeps when
// Config.SpareChunks is 0.
const DefaultSpareChunks = 2

// spareHint asks the refiller for a spare at chunk i of rs.
type spareHint struct {
	rs *resState
	i  int
}

// hint offers the refiller chunk i of rs, without blocking, with m.mu held:
// a full queue drops the hint (the next growth sends another).
func (m *Mechanism) hint(rs *resState, i int) {
	if m.spareMax == 0 || i >= int(rs.size/m.gran) || !rs.at(i).empty() {
		return
	}
	select {
	case m.hints <- spareHint{rs, i}:
		m.queued++
	default:
	}
}

// quiesce waits until the refiller has served every hint sent so far, so
// that a test sees settled counters.
func (m *Mechanism) quiesce() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.queued > 0 {
		m.settled.Wait()
	}
}

// refill is the refiller's loop: it maps a spare for each hint it can serve,
// until Close.
func (m *Mechanism) refill() {
	defer close(m.refillDone)
	for {
		select {
		case <-m.stopRefill:
			return
		case h := <-m.hints:
			m.makeSpare(h.rs, h.i)
			m.mu.Lock()
			m.queued--
			m.settled.Broadcast()
			m.mu.Unlock()
		}
	}
}

// makeSpare maps a pool handle (or a new one) at chunk i of rs with
// read-write access, unless the chunk is taken, the reservation gone, or the
// spares and the pool at their bound. The driver calls run without m.mu; the
// chunk is pending meanwhile.
func (m *Mechanism) makeSpare(rs *resState, i int) {
	m.mu.Lock()
	if m.closed || m.dev.lost.Load() != nil || !m.live(rs) || !rs.at(i).empty() ||
		m.spares+m.pendings >= m.spareMax {
		m.mu.Unlock()
		return
	}
	var h driver.MemHandle
	if n := len(m.pool); n > 0 {
		h, m.pool = m.pool[n-1], m.pool[:n-1]
	} else if len(m.pool)+m.spares+m.pendings >= m.poolMax {
		m.mu.Unlock()
		return
	}
	rs.set(i, chunk{pending: true})
	m.pendings++
	m.mu.Unlock()

	addr := driver.DevicePtr(rs.addr + uint64(i)*m.gran)
	created := h == 0
	err := m.dev.do(func(t *driver.Table) error {
		x := m.txn(t)
		if created {
			var err error
			if h, err = m.createHandle(x, m.gran); err != nil {
				return err
			}
		}
		if err := x.step("cuMemMap", t.MemMap(addr, m.gran, 0, h, 0), func() {
			x.quiet("cuMemUnmap", t.MemUnmap(addr, m.gran))
		}); err != nil {
			return err
		}
		return x.step("cuMemSetAccess", t.MemSetAccess(addr, m.gran, &m.rw, 1), nil)
	})

	m.mu.Lock()
	defer m.mu.Unlock()
	m.pendings--
	defer m.settled.Broadcast()
	if err != nil {
		rs.set(i, chunk{})
		if !created {
			m.pool = append(m.pool, h) // back where it came from
		}
		m.log.Debug("cuda: spare not mapped", "err", err)
		return
	}
	if created {
		m.pooled.Add(m.gran)
	}
	rs.set(i, chunk{handle: h, spare: true})
	m.spares++
}

// live reports whether rs is a reservation of m still. m.mu is held.
func (m *Mechanism) live(rs *resState) bool {
	_, ok := m.reserves[rs]
	return ok
}

// waitPending waits, with m.mu held, until no chunk of [first, first+n) of
// rs is being mapped by the refiller.
func (m *Mechanism) waitPending(rs *resState, first, n int) {
	for {
		busy := false
		for i := first; i < first+n; i++ {
			if rs.at(i).pending {
				busy = true
				break
			}
		}
		if !busy {
			return
		}
		m.settled.Wait()
	}
}

// keepSpare turns the chunk i of rs, still mapped, into a spare, with m.mu
// held; the caller held the room for it (in m.pendings).
func (m *Mechanism) keepSpare(rs *resState, i int) {
	rs.set(i, chunk{handle: rs.at(i).handle, spare: true})
	m.spares++
	m.pooled.Add(m.gran)
}

// evictSpares unmaps the spares among chunks [first, first+n) of rs and
// returns their handles to the pool (or the driver), with m.mu held and on
// the device thread, so the range can take something else. Nothing can be
// pending over the range (the caller waited).
func (m *Mechanism) evictSpares(x *txn, rs *resState, first, n int) error {
	for i := first; i < first+n; i++ {
		c := rs.at(i)
		if !c.spare {
			continue
		}
		if err := x.settle(m.dev); err != nil {
			return err
		}
		addr := driver.DevicePtr(rs.addr + uint64(i)*m.gran)
		if err := check(x.t, "cuMemUnmap", x.t.MemUnmap(addr, m.gran)); err != nil {
			return err
		}
		rs.set(i, chunk{})
		m.spares--
		m.pooled.Add(^(m.gran - 1))
		m.recycle(x.t, c.handle, m.gran)
	}
	return nil
}
