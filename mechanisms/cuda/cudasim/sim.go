package cudasim

import (
	"errors"
	"sort"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// Config describes the simulated machine. The zero value is one device with
// 4 GiB, 2 MiB granularity, VMM support and events that complete at once.
type Config struct {
	Devices      int    // devices present; 0 means 1
	NoDevice     bool   // cuInit fails with CUDA_ERROR_NO_DEVICE
	Stub         bool   // cuInit fails with CUDA_ERROR_STUB_LIBRARY, as the toolkit's stub libcuda does
	Memory       uint64 // device memory per device; 0 means 4 GiB
	Granularity  uint64 // VMM allocation granularity, a power of two; 0 means 2 MiB
	AllocPage    uint64 // cuMemAlloc charges each block rounded up to this; 0 means Granularity
	NoVMM        bool   // attribute 102 reads 0 and the VMM calls fail with CUDA_ERROR_NOT_SUPPORTED
	ManualEvents bool   // recorded events stay pending until CompleteEvents, a stream sync or destroy
	// Pool, when set, is physical memory the devices share with other
	// simulators, as one GPU's memory is shared by every process using
	// it: each device's allocations are also taken from it, an allocation
	// it cannot cover is CUDA_ERROR_OUT_OF_MEMORY, and cuMemGetInfo
	// reports at most its free bytes.
	Pool MemoryPool
	// Faults, when set, is asked before every entry point runs (after it
	// is counted, before it checks or changes anything), with
	//
	//	memapi.Op{Layer: "cudasim", Name: call, Call: n}
	//
	// where call is the entry point's C symbol without version suffix
	// ("cuMemMap") and n its number among this simulator's calls of it.
	// An error makes the entry point return the CUresult it carries (a
	// driver.Result is an error), or for any other error the code nearest
	// its memapi kind (ErrOutOfMemory: CUDA_ERROR_OUT_OF_MEMORY,
	// ErrUnsupported: CUDA_ERROR_NOT_SUPPORTED, ErrInvalidSize,
	// ErrInvalidRange and ErrUnaligned: CUDA_ERROR_INVALID_VALUE,
	// otherwise CUDA_ERROR_UNKNOWN). A CUresult cannot carry
	// memapi.ErrInjected. The injector is asked with the simulator's lock
	// held: it must not call the simulator. Sim.Inject and Sim.FailCall
	// add more at run time.
	Faults memapi.Injector
}

// Layer is the memapi.Op.Layer of the simulator's entry points.
const Layer = "cudasim"

// MemoryPool is device memory shared by several simulators (for example
// in several processes, through shared memory). Take takes n bytes or
// reports false, taking nothing; Give returns n bytes; Free reports the
// bytes not taken. All three are safe for concurrent use.
type MemoryPool interface {
	Take(n uint64) bool
	Give(n uint64)
	Free() uint64
}

// charge takes n bytes of d's memory (and of the shared pool), or reports
// false, taking nothing.
func (s *Sim) charge(d *device, n uint64) bool {
	if n > s.cfg.Memory-d.used {
		return false
	}
	if s.cfg.Pool != nil && !s.cfg.Pool.Take(n) {
		return false
	}
	d.used += n
	return true
}

// uncharge returns n bytes of d's memory (and of the shared pool).
func (s *Sim) uncharge(d *device, n uint64) {
	d.used -= n
	if s.cfg.Pool != nil {
		s.cfg.Pool.Give(n)
	}
}

const (
	poison   = 0xA5
	allocVA  = 0x7000_0000_0000 // where cuMemAlloc blocks start
	reserveV = 0x7e00_0000_0000 // where reservations start

	// allocAlign is the alignment of a cuMemAlloc block, the documented
	// minimum: blocks start 256 bytes into a page.
	allocAlign = 256
)

// Sim is one simulated driver. All its methods are safe for concurrent use;
// the entry points in Table behave like the driver's, including the per-thread
// current context.
type Sim struct {
	cfg  Config
	mu   sync.Mutex
	cond *sync.Cond // signalled when an event completes or is destroyed

	initialized bool
	sticky      driver.Result // a sticky error: once set, every context call returns it
	devs        []*device
	current     map[int]driver.Context // OS thread -> current context
	nextAlloc   uint64
	nextReserve uint64
	nextID      uint64

	allocs   []*block // cuMemAlloc blocks, sorted by addr
	phys     map[driver.MemHandle]*physical
	reserved []*reservation // sorted by addr
	streams  map[driver.Stream]*stream
	events   map[driver.Event]*event

	pending []*work // queued device work, in order (see work)
	seq     uint64  // sequence number of the last work enqueued

	calls  map[string]int
	faults memapi.FaultSet // Config.Faults, then Inject's and FailCall's
}

type device struct {
	ordinal int
	ctx     driver.Context
	refs    int // primary context references
	used    uint64
}

type block struct {
	dev     *device
	addr    uint64
	charged uint64
	size    uint64 // the size asked for
	data    []byte // its bytes, made (poisoned) at the first access: see mem
}

// mem returns the block's bytes, poisoned at the first access. Memory that
// is allocated and freed untouched (most of a stress test's) costs no host
// allocation: a 2 MiB fill per cuMemAlloc under the race detector was most
// of the simulated driver's time.
func (b *block) mem() []byte {
	if b.data == nil {
		b.data = poisoned(b.size)
	}
	return b.data
}

type physical struct {
	handle   driver.MemHandle
	dev      *device
	size     uint64
	data     []byte // made (poisoned) at the first access: see mem
	released bool   // cuMemRelease was called; freed once mappings reaches 0
	mappings int
}

// mem returns the handle's bytes, poisoned at the first access (as
// block.mem).
func (p *physical) mem() []byte {
	if p.data == nil {
		p.data = poisoned(p.size)
	}
	return p.data
}

type reservation struct {
	dev  *device
	addr uint64
	size uint64
	maps []*mapping // sorted by addr
}

type mapping struct {
	addr   uint64
	size   uint64
	off    uint64 // offset into the handle's memory
	phys   *physical
	access int32
}

type stream struct {
	dev         *device
	nonBlocking bool // CU_STREAM_NON_BLOCKING: not ordered with the legacy stream
}

type event struct {
	dev      *device
	stream   driver.Stream
	recorded bool
	done     bool
	seq      uint64 // the last work enqueued before it was recorded
}

// New returns a simulated driver.
func New(cfg Config) *Sim {
	if cfg.Devices <= 0 {
		cfg.Devices = 1
	}
	if cfg.Memory == 0 {
		cfg.Memory = 4 << 30
	}
	if cfg.Granularity == 0 {
		cfg.Granularity = 2 << 20
	}
	if cfg.AllocPage == 0 {
		cfg.AllocPage = cfg.Granularity
	}
	s := &Sim{
		cfg:         cfg,
		current:     map[int]driver.Context{},
		nextAlloc:   allocVA,
		nextReserve: reserveV,
		nextID:      0x1000,
		phys:        map[driver.MemHandle]*physical{},
		streams:     map[driver.Stream]*stream{},
		events:      map[driver.Event]*event{},
		calls:       map[string]int{},
	}
	s.cond = sync.NewCond(&s.mu)
	s.faults.Add(cfg.Faults)
	for i := 0; i < cfg.Devices; i++ {
		s.devs = append(s.devs, &device{ordinal: i, ctx: driver.Context(0xC000 + i)})
	}
	return s
}

// Config returns the configuration in force, defaults filled in.
func (s *Sim) Config() Config { return s.cfg }

// Table returns a driver table whose entry points are this simulator's.
func (s *Sim) Table() *driver.Table {
	return &driver.Table{
		Source:                      "cudasim",
		Init:                        s.initDriver,
		DeviceGet:                   s.deviceGet,
		DeviceGetAttribute:          s.deviceGetAttribute,
		DevicePrimaryCtxRetain:      s.primaryCtxRetain,
		DevicePrimaryCtxRelease:     s.primaryCtxRelease,
		CtxSetCurrent:               s.ctxSetCurrent,
		MemGetInfo:                  s.memGetInfo,
		MemAlloc:                    s.memAlloc,
		MemFree:                     s.memFree,
		MemsetD8:                    s.memsetD8,
		MemAddressReserve:           s.memAddressReserve,
		MemAddressFree:              s.memAddressFree,
		MemCreate:                   s.memCreate,
		MemRelease:                  s.memRelease,
		MemMap:                      s.memMap,
		MemUnmap:                    s.memUnmap,
		MemSetAccess:                s.memSetAccess,
		MemGetAllocationGranularity: s.memGetAllocationGranularity,
		StreamCreate:                s.streamCreate,
		StreamDestroy:               s.streamDestroy,
		StreamSynchronize:           s.streamSynchronize,
		EventCreate:                 s.eventCreate,
		EventRecord:                 s.eventRecord,
		EventQuery:                  s.eventQuery,
		EventSynchronize:            s.eventSynchronize,
		EventDestroy:                s.eventDestroy,
		MemcpyHtoD:                  s.memcpyHtoD,
		MemcpyDtoH:                  s.memcpyDtoH,
		MemcpyDtoHAsync:             s.memcpyDtoHAsync,
		MemcpyDtoD:                  s.memcpyDtoD,
		GetErrorName:                s.getErrorName,
	}
}

// FailCall makes the nth next call of the named entry point (its C symbol
// name without version suffix, e.g. "cuMemMap"; nth 1 is the very next call)
// fail with code before it changes anything. It is
// Inject(memapi.Fail(code).On(Layer, call).Nth(nth)).
func (s *Sim) FailCall(call string, nth int, code driver.Result) {
	s.Inject(memapi.Fail(code).On(Layer, call).Nth(max(nth, 1)))
}

// Inject adds a fault injector, asked (after Config.Faults and those
// injected before it) as Config.Faults is.
func (s *Sim) Inject(i memapi.Injector) { s.faults.Add(i) }

// ClearFaults removes every fault injector, Config.Faults included.
func (s *Sim) ClearFaults() { s.faults.Clear() }

// resultOf is the CUresult an injected error stands for (see Config.Faults).
func resultOf(err error) driver.Result {
	var r driver.Result
	switch {
	case errors.As(err, &r) && r != driver.Success:
		return r
	case errors.Is(err, memapi.ErrOutOfMemory):
		return driver.ErrOutOfMemory
	case errors.Is(err, memapi.ErrUnsupported):
		return driver.ErrNotSupported
	case errors.Is(err, memapi.ErrInvalidSize), errors.Is(err, memapi.ErrInvalidRange), errors.Is(err, memapi.ErrUnaligned):
		return driver.ErrInvalidValue
	}
	return driver.ErrUnknown
}

// Calls reports how many times the named entry point was called.
func (s *Sim) Calls(call string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[call]
}

// Stats is a snapshot of what is live in the simulator.
type Stats struct {
	Used          uint64 // device memory in use, over all devices
	Blocks        int    // live cuMemAlloc blocks
	Handles       int    // physical allocations not yet freed (released or not)
	Mappings      int
	Reservations  int
	Streams       int
	Events        int
	PendingEvents int
	PendingWork   int // queued copies and memsets not yet run
	ContextRefs   int // primary context references, over all devices
	Sticky        driver.Result
}

// Stats returns what is live now.
func (s *Sim) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Blocks:       len(s.allocs),
		Handles:      len(s.phys),
		Reservations: len(s.reserved),
		Streams:      len(s.streams),
		Events:       len(s.events),
		Sticky:       s.sticky,
		PendingWork:  len(s.pending),
	}
	for _, d := range s.devs {
		st.Used += d.used
		st.ContextRefs += d.refs
	}
	for _, r := range s.reserved {
		st.Mappings += len(r.maps)
	}
	for _, e := range s.events {
		if e.recorded && !e.done {
			st.PendingEvents++
		}
	}
	return st
}

// CompleteEvents runs the pending work and completes every pending event,
// as the GPU finishing its work would, and returns how many it completed.
func (s *Sim) CompleteEvents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runAll()
	n := 0
	for _, e := range s.events {
		if e.recorded && !e.done {
			e.done = true
			n++
		}
	}
	s.cond.Broadcast()
	return n
}

// enter starts an entry point with s.mu held: it counts the call, asks the
// fault injectors, and checks initialisation; with needCtx it also checks the
// sticky error and returns the device of the calling thread's current context.
func (s *Sim) enter(call string, needCtx bool) (*device, driver.Result) {
	s.calls[call]++
	if !s.faults.Empty() {
		if err := s.faults.MaybeError(memapi.Op{Layer: Layer, Name: call, Call: s.calls[call]}); err != nil {
			return nil, resultOf(err)
		}
	}
	if !s.initialized {
		return nil, driver.ErrNotInitialized
	}
	if !needCtx {
		return nil, driver.Success
	}
	if s.sticky != driver.Success {
		return nil, s.sticky
	}
	ctx, ok := s.current[threadID()]
	if !ok {
		return nil, driver.ErrInvalidContext
	}
	for _, d := range s.devs {
		if d.ctx == ctx && d.refs > 0 {
			return d, driver.Success
		}
	}
	return nil, driver.ErrInvalidContext
}

func (s *Sim) id() uint64 {
	s.nextID++
	return s.nextID
}

func roundUp(n, g uint64) uint64 {
	return (n + g - 1) / g * g
}

func poisoned(n uint64) []byte {
	b := make([]byte, n)
	fill(b, poison)
	return b
}

// fill sets every byte of b to v, doubling with copy (fast even under -race).
func fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for i := 1; i < len(b); i *= 2 {
		copy(b[i:], b[:i])
	}
}

// findBlock returns the cuMemAlloc block holding addr.
func (s *Sim) findBlock(addr uint64) *block {
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].addr > addr }) - 1
	if i < 0 {
		return nil
	}
	b := s.allocs[i]
	if addr < b.addr+b.size {
		return b
	}
	return nil
}

// findReservation returns the reservation holding addr.
func (s *Sim) findReservation(addr uint64) *reservation {
	i := sort.Search(len(s.reserved), func(i int) bool { return s.reserved[i].addr > addr }) - 1
	if i < 0 {
		return nil
	}
	r := s.reserved[i]
	if addr < r.addr+r.size {
		return r
	}
	return nil
}

// find returns the index of the mapping holding addr in r, or -1.
func (r *reservation) find(addr uint64) int {
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].addr > addr }) - 1
	if i >= 0 && addr < r.maps[i].addr+r.maps[i].size {
		return i
	}
	return -1
}
