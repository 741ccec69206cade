package cuda

import (
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Context is the CUDA device context of one mechanism: it makes streams
// (a CUstream each) whose copies reach exactly the memory of that
// mechanism's handles. It implements memapi.DeviceContext.
type Context struct {
	m       *Mechanism
	mu      sync.Mutex
	streams map[*Stream]struct{}
	closed  bool
}

var _ memapi.DeviceContext = (*Context)(nil)

// NewContext returns a device context for m's memory.
func (m *Mechanism) NewContext() (*Context, error) {
	if err := m.enter("cuda.NewContext"); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	c := &Context{m: m, streams: map[*Stream]struct{}{}}
	m.ctxMu.Lock()
	m.contexts[c] = struct{}{}
	m.ctxMu.Unlock()
	return c, nil
}

// Device returns the CUDA device the context runs on.
func (c *Context) Device() memapi.DeviceKey { return c.m.info.Device }

// NewStream creates a stream (cuStreamCreate, CU_STREAM_DEFAULT: ordered
// with the legacy default stream, which the synchronous copies use).
func (c *Context) NewStream() (memapi.Stream, error) {
	const op = "DeviceContext.NewStream"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, c.m.fail(op, memapi.ErrClosed, nil, "context closed")
	}
	var h driver.Stream
	if err := c.m.dev.do(func(t *driver.Table) error {
		return check(t, "cuStreamCreate", t.StreamCreate(&h, driver.StreamDefault))
	}); err != nil {
		return nil, c.m.driverErr(op, err, 0)
	}
	s := &Stream{c: c, h: h}
	c.streams[s] = struct{}{}
	return s, nil
}

// Close releases the context. It fails with ErrInUse while streams are
// open, and is idempotent.
func (c *Context) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	if n := len(c.streams); n > 0 {
		return c.m.fail("DeviceContext.Close", memapi.ErrInUse, nil, "%d streams are open", n)
	}
	c.closed = true
	c.m.ctxMu.Lock()
	delete(c.m.contexts, c)
	c.m.ctxMu.Unlock()
	return nil
}

// shutdown closes the context and its streams for Mechanism.Close and
// returns how many streams were open.
func (c *Context) shutdown() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.streams)
	for s := range c.streams {
		s.close()
	}
	clear(c.streams)
	c.closed = true
	c.m.ctxMu.Lock()
	delete(c.m.contexts, c)
	c.m.ctxMu.Unlock()
	return n
}
