package cuda

import (
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// guard checks, with m.mu held, that [addr, addr+n) is memory of this
// mechanism that a copy may read, or write when write is set: inside one
// allocation or one reservation (ErrInvalidRange otherwise), backed in every
// chunk (ErrNotCommitted), and not a read-only view when written
// (ErrReadOnly). On a GPU a copy that faults is a sticky error that ends the
// context, so the device context refuses such copies before the driver sees
// them; the simulator enforces the same rules as a backstop.
func (m *Mechanism) guard(op string, addr, n uint64, write bool) error {
	end := addr + n
	if end < addr {
		return m.fail(op, memapi.ErrInvalidRange, nil, "%d bytes at %#x wrap around", n, addr)
	}
	reg := m.regions.find(addr)
	if reg == nil {
		return m.fail(op, memapi.ErrInvalidRange, nil, "%#x is not memory of this mechanism", addr)
	}
	if end > reg.end {
		return m.fail(op, memapi.ErrInvalidRange, nil, "%d bytes at %#x run past the end of the region at %#x", n, addr, reg.start)
	}
	if reg.alloc != nil {
		return nil
	}
	rs := reg.res
	for i := (addr - rs.addr) / m.gran; i <= (end-1-rs.addr)/m.gran; i++ {
		c := rs.at(int(i))
		switch {
		case c.committed():
		case c.view != nil:
			if write && c.view.access == memapi.AccessReadOnly {
				return m.fail(op, memapi.ErrReadOnly, c.view.h, "%#x is mapped by a read-only view", rs.addr+i*m.gran)
			}
		default:
			return m.fail(op, memapi.ErrNotCommitted, rs.h, "%#x has no backing", rs.addr+i*m.gran)
		}
	}
	return nil
}

// span is one side of a copy: a device range and whether it is written.
type span struct {
	addr  uint64
	write bool
}

// copy checks every device side of a copy of n bytes and runs it on the
// device thread, with m.mu held throughout so that nothing is unmapped
// between the check and the copy.
func (m *Mechanism) copy(op string, n uint64, fn func(t *driver.Table) error, spans ...span) error {
	if err := m.enter(op); err != nil {
		return err
	}
	defer m.mu.Unlock()
	for _, s := range spans {
		if err := m.guard(op, s.addr, n, s.write); err != nil {
			return err
		}
	}
	if err := m.dev.do(fn); err != nil {
		return m.driverErr(op, err, 0)
	}
	return nil
}
