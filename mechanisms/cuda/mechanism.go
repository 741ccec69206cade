package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/privacct"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// defaultGranularity is used for allocation rounding on devices without VMM,
// where the driver reports no granularity: the page size of its pool.
const defaultGranularity = 2 << 20

// DefaultPoolChunks is how many pre-created physical handles a mechanism
// keeps when Config.PoolChunks is 0.
const DefaultPoolChunks = 4

// Config selects the device and the driver.
type Config struct {
	// Ordinal is the CUDA device ordinal.
	Ordinal int
	// Driver is the driver table; nil loads libcuda.so.1 (driver.Open).
	// Tests pass a cudasim table.
	Driver *driver.Table
	// Authority is the ledger authority of the device's memory; empty means
	// "cuda:<ordinal>".
	Authority memapi.AuthorityID
	// AllocGranularity is what DeviceAllocator.Allocate rounds sizes up to, a
	// power of two of at least 256; 0 means the device's VMM granularity
	// (2 MiB on current GPUs). See the package documentation for why.
	AllocGranularity memapi.Bytes
	// PoolChunks is how many pre-created granularity-sized physical handles
	// the mechanism keeps for Commit (0 means DefaultPoolChunks; negative
	// means no pool). The pool's bytes are the mechanism's own overhead: they
	// are not in UsedBytes, PooledBytes reports them, and PoolLimit bounds them.
	PoolChunks int
	// SpareChunks is how many of the pool's chunks may stay mapped, with
	// read-write access, at reservations' uncommitted chunks where the next
	// Commit is expected (0 means DefaultSpareChunks, negative none; never
	// more than the pool). See spare.go.
	SpareChunks int
	// Private accounts the device memory the mechanism keeps for itself:
	// New keeps PoolLimit bytes with it before it creates the pool (and
	// fails with its error, having taken nothing on the device, when it
	// refuses: no room for the pool), and Close releases them once the pool
	// is gone. Left nil, the account is the one this process shares for
	// Authority, if any: a cross-process ledger bound under that ID
	// (xproc.Ledger.Bind), before or after New (Bind then claims the
	// pool, or fails when the ledger has no room), so that each process's
	// pool and spares are counted in its slot and the claims of all of
	// them never exceed what the device holds. Set it to name another.
	Private PrivateAccount
	// Logger receives diagnostics (failed rollbacks); nil discards them
	// (memgen never logs unasked).
	Logger *slog.Logger
}

// PrivateAccount accounts memory a mechanism keeps for itself, outside
// any reservation (Config.Private).
type PrivateAccount interface {
	KeepPrivate(bytes memapi.Bytes) error
	ReleasePrivate(bytes memapi.Bytes) error
}

// Mechanism is the CUDA mechanism of one device: DeviceAllocator over
// cuMemAlloc, VirtualBacking and SharedMapping over the VMM API when the
// device supports it. It is safe for concurrent use.
type Mechanism struct {
	dev     *device
	issuer  *memapi.Issuer
	info    memapi.MechanismInfo
	gran    uint64 // VMM granularity
	prop    driver.MemAllocationProp
	rw, ro  driver.MemAccessDesc
	poolMax int
	log     *slog.Logger
	private PrivateAccount // keeps PoolLimit bytes while the mechanism is open, or nil
	kept    *privacct.Kept // PoolLimit bytes on the authority's shared account, when Private is nil

	used   atomic.Uint64 // allocations + committed + backings
	pooled atomic.Uint64 // bytes held in the pool

	mu       sync.Mutex // orders state changes with their driver calls
	closed   bool
	regions  regions
	allocs   map[*allocState]struct{}
	reserves map[*resState]struct{}
	backings map[*backingState]struct{}
	pool     []driver.MemHandle // granularity-sized handles, unmapped
	stuck    []driver.MemHandle // handles whose cuMemRelease failed
	settled  *sync.Cond         // on mu: a pending spare settled

	spareMax, spares, pendings int // spares: the bound, mapped now, being mapped
	queued                     int // hints sent and not yet served
	inflight                   int // Commits making their driver calls outside mu
	hints                      chan spareHint
	stopRefill, refillDone     chan struct{}

	ctxMu    sync.Mutex
	contexts map[*Context]struct{}
}

// New opens the device and returns its mechanism. When CUDA cannot run here
// (no libcuda.so.1, a stub library, no device) it returns an
// *UnavailableError, which matches memapi.ErrUnavailable.
func New(cfg Config) (*Mechanism, error) {
	t := cfg.Driver
	if t == nil {
		var err error
		if t, err = driver.Open(); err != nil {
			return nil, unavailableLoad(err)
		}
	}
	if cfg.Ordinal < 0 {
		return nil, &UnavailableError{Reason: NoDevice, Detail: "ordinal " + strconv.Itoa(cfg.Ordinal)}
	}
	ag := cfg.AllocGranularity
	if ag != 0 && (ag < 256 || ag&(ag-1) != 0) {
		return nil, memapi.Errorf("cuda.New", memapi.ErrInvalidSize, "allocation granularity %d is not a power of two of at least 256", ag)
	}
	d, err := openDevice(t, cfg.Ordinal)
	if err != nil {
		return nil, err
	}
	m := &Mechanism{
		dev:      d,
		issuer:   memapi.NewIssuer(),
		gran:     d.gran,
		prop:     driver.DeviceProp(d.dev),
		poolMax:  cfg.PoolChunks,
		log:      cfg.Logger,
		allocs:   map[*allocState]struct{}{},
		reserves: map[*resState]struct{}{},
		backings: map[*backingState]struct{}{},
		contexts: map[*Context]struct{}{},
	}
	loc := driver.MemLocation{Type: driver.MemLocationTypeDevice, ID: int32(d.dev)}
	m.rw = driver.MemAccessDesc{Location: loc, Flags: driver.MemAccessProtReadWrite}
	m.ro = driver.MemAccessDesc{Location: loc, Flags: driver.MemAccessProtRead}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.gran == 0 {
		m.gran = defaultGranularity
	}
	if ag == 0 {
		ag = memapi.Bytes(m.gran)
	}
	if m.poolMax == 0 {
		m.poolMax = DefaultPoolChunks
	}
	if m.poolMax < 0 || !d.vmm {
		m.poolMax = 0
	}
	m.spareMax = cfg.SpareChunks
	if m.spareMax == 0 {
		m.spareMax = DefaultSpareChunks
	}
	m.spareMax = min(max(m.spareMax, 0), m.poolMax)
	m.settled = sync.NewCond(&m.mu)
	auth := cfg.Authority
	if auth == "" {
		auth = memapi.AuthorityID("cuda:" + strconv.Itoa(cfg.Ordinal))
	}
	m.info = memapi.MechanismInfo{
		Mechanism:        SpecName,
		Instance:         m.issuer.Instance(),
		Device:           memapi.DeviceKey{Kind: memapi.DeviceKindCUDA, Ordinal: cfg.Ordinal},
		Authority:        auth,
		AllocGranularity: ag,
		Granularity:      memapi.Bytes(m.gran),
	}
	if m.poolMax > 0 {
		if cfg.Private != nil {
			if err := cfg.Private.KeepPrivate(m.PoolLimit()); err != nil {
				d.release()
				return nil, err
			}
			m.private = cfg.Private
		} else {
			k, err := privacct.Keep(auth, m.PoolLimit())
			if err != nil {
				d.release()
				return nil, err
			}
			m.kept = k
		}
	}
	m.fillPool()
	if m.spareMax > 0 {
		m.hints = make(chan spareHint, 2*m.spareMax)
		m.stopRefill, m.refillDone = make(chan struct{}), make(chan struct{})
		go m.refill()
	}
	return m, nil
}

// fillPool pre-creates the pool's handles. A device too full to fill it is
// not an error: the pool is an optimisation, and Commit creates what it lacks.
func (m *Mechanism) fillPool() {
	if m.poolMax == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	err := m.dev.do(func(t *driver.Table) error {
		for len(m.pool) < m.poolMax {
			var h driver.MemHandle
			if err := check(t, "cuMemCreate", t.MemCreate(&h, m.gran, &m.prop, 0)); err != nil {
				return err
			}
			m.pool = append(m.pool, h)
			m.pooled.Add(m.gran)
		}
		return nil
	})
	if err != nil {
		m.log.Warn("cuda: pool not filled", "have", len(m.pool), "want", m.poolMax, "err", err)
	}
}

// offers reports whether the device supports capability c now: the VMM
// capabilities need CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.
func (m *Mechanism) offers(c memapi.Capability) bool {
	switch c {
	case memapi.CapDeviceAllocator:
		return true
	case memapi.CapVirtualBacking, memapi.CapSharedMapping:
		return m.dev.vmm
	}
	return false
}

// Info describes the mechanism instance.
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// UsedBytes reports the bytes of allocations, committed ranges and backings
// held now. The pool is not in it (see PooledBytes).
func (m *Mechanism) UsedBytes() memapi.Bytes { return memapi.Bytes(m.used.Load()) }

// PooledBytes reports the bytes of pre-created handles waiting in the pool.
func (m *Mechanism) PooledBytes() memapi.Bytes { return memapi.Bytes(m.pooled.Load()) }

// PoolLimit reports the most bytes the pool keeps: a fixed overhead of the
// mechanism, to subtract from the device memory given to the authority.
// (A handle whose cuMemRelease failed is kept, counted in PooledBytes beyond
// the limit, rather than forgotten, and logged.)
func (m *Mechanism) PoolLimit() memapi.Bytes { return memapi.Bytes(uint64(m.poolMax) * m.gran) }

// MemInfo reports the device's free and total memory (cuMemGetInfo_v2).
func (m *Mechanism) MemInfo(ctx context.Context) (free, total memapi.Bytes, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	var f, tot uint64
	err = m.dev.do(func(t *driver.Table) error {
		return check(t, "cuMemGetInfo_v2", t.MemGetInfo(&f, &tot))
	})
	if err != nil {
		return 0, 0, m.driverErr("cuda.MemInfo", err, 0)
	}
	return memapi.Bytes(f), memapi.Bytes(tot), nil
}

// Close releases everything the mechanism still holds (views, backings,
// committed ranges, reservations, allocations, the pool, the contexts' streams
// and events) and stops the device thread when no other mechanism shares it.
// It returns an error of kind ErrInUse listing what was still live, so leaks
// are seen, but it always closes. Further calls fail with ErrClosed.
func (m *Mechanism) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()

	m.ctxMu.Lock()
	ctxs := make([]*Context, 0, len(m.contexts))
	for c := range m.contexts {
		ctxs = append(ctxs, c)
	}
	m.ctxMu.Unlock()
	var leaks []string
	for _, c := range ctxs {
		if n := c.shutdown(); n > 0 {
			leaks = append(leaks, fmt.Sprintf("%d open streams", n))
		}
		leaks = append(leaks, "an open device context")
	}

	if m.stopRefill != nil {
		close(m.stopRefill)
		<-m.refillDone
	}
	m.mu.Lock()
	for m.inflight > 0 { // a Commit outside the lock settles first
		m.settled.Wait()
	}
	if n := m.teardown(); n != "" {
		leaks = append(leaks, n)
	}
	m.mu.Unlock()
	m.dev.release()
	// The pool's handles are released (or logged as not releasable).
	if m.private != nil {
		if err := m.private.ReleasePrivate(m.PoolLimit()); err != nil {
			m.log.Warn("cuda: the pool's private bytes not given back", "err", err)
		}
	}
	if m.kept != nil {
		if err := m.kept.Release(); err != nil {
			m.log.Warn("cuda: the pool's private bytes not given back", "err", err)
		}
	}
	if len(leaks) > 0 {
		return &memapi.Error{Op: "cuda.Close", Kind: memapi.ErrInUse, Mechanism: SpecName, Authority: m.info.Authority,
			Detail: fmt.Sprintf("released what was still live: %v", leaks)}
	}
	return nil
}

// teardown frees every live handle's memory and the pool, with m.mu held,
// and reports what was live.
func (m *Mechanism) teardown() string {
	var views, backings, reserves, allocs int
	err := m.dev.do(func(t *driver.Table) error {
		var errs []error
		note := func(call string, r driver.Result) {
			if err := check(t, call, r); err != nil {
				errs = append(errs, err)
			}
		}
		note("cuStreamSynchronize", func() driver.Result {
			if err := m.dev.settle(t); err != nil {
				return err.(*DriverError).Code
			}
			return driver.Success
		}())
		for rs := range m.reserves {
			for i, c := range rs.chunks {
				addr := rs.addr + uint64(i)*m.gran
				switch {
				case c.view != nil && c.view.off == uint64(i)*m.gran:
					note("cuMemUnmap", t.MemUnmap(driver.DevicePtr(addr), c.view.len))
					_ = m.issuer.Retire("cuda.Close", c.view.h)
					views++
				case c.handle != 0:
					note("cuMemUnmap", t.MemUnmap(driver.DevicePtr(addr), m.gran))
					note("cuMemRelease", t.MemRelease(c.handle))
				}
			}
			note("cuMemAddressFree", t.MemAddressFree(driver.DevicePtr(rs.addr), rs.size))
			_ = m.issuer.Retire("cuda.Close", rs.h)
			reserves++
		}
		for bs := range m.backings {
			note("cuMemRelease", t.MemRelease(bs.handle))
			_ = m.issuer.Retire("cuda.Close", bs.h)
			backings++
		}
		for as := range m.allocs {
			note("cuMemFree_v2", t.MemFree(driver.DevicePtr(as.addr)))
			_ = m.issuer.Retire("cuda.Close", as.h)
			allocs++
		}
		for _, h := range append(m.pool, m.stuck...) {
			note("cuMemRelease", t.MemRelease(h))
		}
		return errors.Join(errs...)
	})
	if err != nil {
		m.log.Warn("cuda: close could not free everything", "err", err)
	}
	m.pool, m.stuck = nil, nil
	m.spares = 0
	m.pooled.Store(0)
	m.used.Store(0)
	clear(m.reserves)
	clear(m.backings)
	clear(m.allocs)
	m.regions = nil
	if views+backings+reserves+allocs == 0 {
		return ""
	}
	return fmt.Sprintf("%d allocations, %d reservations, %d backings, %d views", allocs, reserves, backings, views)
}

// enter takes m.mu for an operation and fails when the mechanism is closed,
// or with ErrUnavailable when the device's context is lost (a sticky error:
// the driver would refuse the call anyway, and the pool must not hand out
// memory of a lost context).
func (m *Mechanism) enter(op string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return &memapi.Error{Op: op, Kind: memapi.ErrClosed, Mechanism: SpecName, Authority: m.info.Authority}
	}
	if de := m.dev.lost.Load(); de != nil {
		m.mu.Unlock()
		return &memapi.Error{Op: op, Kind: memapi.ErrUnavailable, Mechanism: SpecName, Authority: m.info.Authority,
			Detail: "the CUDA context is lost", Err: de}
	}
	return nil
}

// fail returns a contract error of the given kind.
func (m *Mechanism) fail(op string, kind error, h memapi.Handle, format string, args ...any) error {
	e := &memapi.Error{Op: op, Kind: kind, Mechanism: SpecName, Authority: m.info.Authority, Detail: fmt.Sprintf(format, args...)}
	if h != nil {
		e.Handle = h.ID()
	}
	return e
}

// driverErr wraps an error from the device thread into a contract error
// whose kind is the CUresult's meaning; an out-of-memory error carries the
// bytes wanted and the device's free memory.
func (m *Mechanism) driverErr(op string, err error, wanted uint64) error {
	var me *memapi.Error
	if errors.As(err, &me) && me.Kind == memapi.ErrClosed {
		return &memapi.Error{Op: op, Kind: memapi.ErrClosed, Mechanism: SpecName, Authority: m.info.Authority, Err: err}
	}
	kind := memapi.ErrUnavailable
	var de *DriverError
	if errors.As(err, &de) {
		kind = Kind(de.Call, de.Code)
	}
	e := &memapi.Error{Op: op, Kind: kind, Mechanism: SpecName, Authority: m.info.Authority, Wanted: memapi.Bytes(wanted), Err: err}
	if kind == memapi.ErrOutOfMemory {
		_ = m.dev.do(func(t *driver.Table) error {
			var free, total uint64
			if t.MemGetInfo(&free, &total) == driver.Success {
				e.Available = memapi.Bytes(free)
			}
			return nil
		})
	}
	return e
}

// beyondDevice refuses, with ErrOutOfMemory and the figures, a request for
// more physical memory than the device has: the driver may answer such a
// size with CUDA_ERROR_INVALID_VALUE rather than OUT_OF_MEMORY, and the
// contract says a size the device cannot hold is out of memory.
func (m *Mechanism) beyondDevice(op string, n uint64) error {
	if n <= m.dev.total {
		return nil
	}
	e := m.fail(op, memapi.ErrOutOfMemory, nil, "%d bytes is more than the device's %d", n, m.dev.total).(*memapi.Error)
	e.Wanted, e.Available = memapi.Bytes(n), memapi.Bytes(m.dev.total)
	return e
}

// roundUp rounds n up to a multiple of the power of two g, reporting overflow.
func roundUp(n, g uint64) (uint64, bool) {
	r, ok := memapi.RoundUp(memapi.Bytes(n), memapi.Bytes(g))
	return uint64(r), ok
}
