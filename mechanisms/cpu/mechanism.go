package cpu

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/memgen/memgen/generated/memapi"
)

// Granularities the mechanism is usually run with. Granularity2MiB mirrors
// the CUDA VMM granularity and lets the kernel back each chunk with one
// transparent huge page; Granularity4KiB commits page by page.
const (
	Granularity4KiB memapi.Bytes = 4 << 10
	Granularity2MiB memapi.Bytes = 2 << 20
)

// DefaultAuthority is the authority a mechanism reports when Options leaves
// it empty.
const DefaultAuthority memapi.AuthorityID = "host"

// maxSize is the largest request the mechanism considers: the 47-bit user
// address space of x86-64 and arm64 with 4-level page tables. Anything larger
// is an absurd size (ErrInvalidSize), not an out-of-memory.
const maxSize = 1 << 47

// maxGranularity bounds Options.Granularity (and AllocRequest.Align).
const maxGranularity = 1 << 30

// pageSize is the kernel's page size, the allocation granularity.
var pageSize = unix.Getpagesize()

// Options configures a Mechanism.
type Options struct {
	// Granularity of VirtualBacking and SharedMapping: a power of two, a
	// multiple of the page size, at most 1 GiB. 0 means Granularity2MiB.
	Granularity memapi.Bytes
	// Authority the mechanism's memory is accounted to; "" means
	// DefaultAuthority.
	Authority memapi.AuthorityID
	// Ordinal of the host device, 0 unless a runtime models several host
	// pools (NUMA nodes) as separate devices.
	Ordinal int
	// NoHugePages disables the MADV_HUGEPAGE advice given to reservations
	// whose granularity is a multiple of 2 MiB.
	NoHugePages bool
	// Faults, when set, is asked before every kernel call whose failure
	// the mechanism handles (and so before it changes anything), with
	//
	//	memapi.Op{Layer: "cpu", Name: call, Bytes: n, Authority: a, Args: op}
	//
	// where call is the system call ("mmap", "munmap", "mprotect",
	// "madvise" for MADV_POPULATE_WRITE and MADV_DONTNEED, "memfd_create",
	// "ftruncate", "fallocate", "pwrite"), n the bytes it is about and op
	// the contract operation making it ("VirtualBacking.Commit"). An error
	// stands for the kernel's: the call is not made, and the mechanism
	// cleans up and fails as it would for that errno. Its error's Kind is
	// ErrOutOfMemory for unix.ENOMEM, EAGAIN, ENOSPC, EFAULT or
	// memapi.ErrOutOfMemory, and otherwise what the call's failure is
	// there (see each method); its cause is the injected error, marked
	// with memapi.ErrInjected. The advice and the clean-up calls whose
	// failure the mechanism ignores are not asked about. Without an
	// injector each call costs one nil check.
	Faults memapi.Injector
}

// Layer is the memapi.Op.Layer of the mechanism's kernel calls.
const Layer = "cpu"

// Mechanism is the CPU memory mechanism: Linux host memory from anonymous
// mmap (DeviceAllocator), PROT_NONE reservations committed with mprotect and
// MADV_POPULATE_WRITE (VirtualBacking), and memfd backings mapped with
// MAP_SHARED|MAP_FIXED into reservations (SharedMapping).
//
// A Mechanism is safe for concurrent use. Its handles are valid only with
// the instance that created them.
type Mechanism struct {
	info    memapi.MechanismInfo
	issuer  *memapi.Issuer
	gran    uintptr
	huge    bool // advise MADV_HUGEPAGE on reservations
	sharing bool // memfd_create works: SharedMapping is offered

	// mu guards every mapping's state and the region index. Device-context
	// copies hold it for reading while they touch memory, so no mapping can
	// be decommitted, unmapped or freed under a copy.
	mu       sync.RWMutex
	settled  *sync.Cond // on mu: a reservation's last Commit in flight settled
	regions  []*region  // sorted by base address, non-overlapping
	backings map[*backing]struct{}

	// populate faults a committed range in (sys.go's populate; tests
	// replace it to hold a Commit between its claim and its settling).
	populate func(p unsafe.Pointer, n uintptr) error

	faults memapi.Injector // Options.Faults, or nil

	allocBytes     atomic.Uint64
	committedBytes atomic.Uint64
	backingBytes   atomic.Uint64
}

// region is one mapping the mechanism owns in the process's address space:
// an allocation or a reservation.
type region struct {
	base  uint64 // the address as the contract sees it
	size  uint64
	ptr   unsafe.Pointer
	alloc *allocation
	res   *reservation
}

// New returns a CPU mechanism. It fails with ErrInvalidSize when the
// granularity is not a power of two multiple of the page size (or above
// 1 GiB). SharedMapping is offered when the kernel has memfd_create.
func New(o Options) (*Mechanism, error) {
	g := o.Granularity
	if g == 0 {
		g = Granularity2MiB
	}
	if g&(g-1) != 0 || g%memapi.Bytes(pageSize) != 0 || g > maxGranularity {
		return nil, &memapi.Error{
			Op:     "cpu.New",
			Kind:   memapi.ErrInvalidSize,
			Wanted: g,
			Detail: fmt.Sprintf("granularity must be a power of two multiple of the %d-byte page, at most 1 GiB", pageSize),
		}
	}
	a := o.Authority
	if a == "" {
		a = DefaultAuthority
	}
	is := memapi.NewIssuer()
	m := &Mechanism{
		info: memapi.MechanismInfo{
			Mechanism:        SpecName,
			Instance:         is.Instance(),
			Device:           memapi.DeviceKey{Kind: memapi.DeviceKindHost, Ordinal: o.Ordinal},
			Authority:        a,
			AllocGranularity: memapi.Bytes(pageSize),
			Granularity:      g,
		},
		issuer:   is,
		gran:     uintptr(g),
		huge:     !o.NoHugePages && g%Granularity2MiB == 0,
		sharing:  memfdSupported(),
		backings: map[*backing]struct{}{},
		populate: populate,
		faults:   o.Faults,
	}
	m.settled = sync.NewCond(&m.mu)
	return m, nil
}

// memfdSupported probes memfd_create once.
var memfdSupported = sync.OnceValue(func() bool {
	fd, err := unix.MemfdCreate("memgen-probe", unix.MFD_CLOEXEC)
	if err != nil {
		return false
	}
	_ = unix.Close(fd)
	return true
})

// offers reports whether this instance offers c now; the generated
// accessors ask it.
func (m *Mechanism) offers(c memapi.Capability) bool {
	switch c {
	case memapi.CapDeviceAllocator, memapi.CapVirtualBacking:
		return true
	case memapi.CapSharedMapping:
		return m.sharing
	}
	return false
}

// Info describes the mechanism instance.
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// UsedBytes reports the physical bytes the instance holds: allocations,
// bytes committed in reservations and shared backings (each backing once,
// however many views map it).
func (m *Mechanism) UsedBytes() memapi.Bytes {
	return memapi.Bytes(m.allocBytes.Load() + m.committedBytes.Load() + m.backingBytes.Load())
}

// KernelBytes reports what the kernel says the instance holds: mincore over
// every allocation and over the committed extents of every reservation
// (views excluded, since mincore reports a shared file's pages, not this
// mapping's; the rest of a reservation is PROT_NONE with its pages dropped),
// plus the allocated blocks of every backing's memfd. At a quiescent point it
// equals UsedBytes; tests and the ledger's audits compare the two. Its cost
// is in proportion to the bytes held, not to the address space reserved: a
// 1 TiB reservation with 4 MiB committed is 4 MiB of mincore.
func (m *Mechanism) KernelBytes() (memapi.Bytes, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var total uint64
	for _, rg := range m.regions {
		if rg.alloc != nil {
			n, err := mincore(rg.ptr, uintptr(rg.size))
			if err != nil {
				return 0, m.errno("KernelBytes", memapi.ErrInvalidRange, err, "mincore over an allocation")
			}
			total += n
			continue
		}
		for _, e := range rg.res.backed {
			if e.kind != extCommitted {
				continue
			}
			n, err := mincore(unsafe.Add(rg.ptr, e.off), uintptr(e.end-e.off))
			if err != nil {
				return 0, m.errno("KernelBytes", memapi.ErrInvalidRange, err, "mincore over a reservation")
			}
			total += n
		}
	}
	for b := range m.backings {
		n, err := fileBytes(b.fd)
		if err != nil {
			return 0, m.errno("KernelBytes", memapi.ErrInvalidRange, err, "fstat of a backing")
		}
		total += n
	}
	return memapi.Bytes(total), nil
}

// Stats is a snapshot of what a Mechanism holds.
type Stats struct {
	Allocations, Reservations, Backings, Views   int
	AllocatedBytes, CommittedBytes, BackingBytes memapi.Bytes
}

// Stats returns a snapshot of the instance's handles and bytes.
func (m *Mechanism) Stats() Stats {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var s Stats
	for _, rg := range m.regions {
		if rg.alloc != nil {
			s.Allocations++
		} else {
			s.Reservations++
			s.Views += rg.res.views
		}
	}
	s.Backings = len(m.backings)
	s.AllocatedBytes = memapi.Bytes(m.allocBytes.Load())
	s.CommittedBytes = memapi.Bytes(m.committedBytes.Load())
	s.BackingBytes = memapi.Bytes(m.backingBytes.Load())
	return s
}

// insertRegion adds rg to the index. The caller holds mu.
func (m *Mechanism) insertRegion(rg *region) {
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].base > rg.base })
	m.regions = append(m.regions, nil)
	copy(m.regions[i+1:], m.regions[i:])
	m.regions[i] = rg
}

// removeRegion drops the region starting at base from the index. The caller
// holds mu.
func (m *Mechanism) removeRegion(base uint64) {
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].base >= base })
	if i < len(m.regions) && m.regions[i].base == base {
		m.regions = append(m.regions[:i], m.regions[i+1:]...)
	}
}

// lookup returns the region holding addr, or nil. The caller holds mu.
func (m *Mechanism) lookup(addr uint64) *region {
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].base > addr })
	if i == 0 {
		return nil
	}
	rg := m.regions[i-1]
	if addr-rg.base >= rg.size {
		return nil
	}
	return rg
}

// fail returns a typed error stamped with the mechanism and authority.
func (m *Mechanism) fail(op string, kind error, h memapi.HandleID, wanted, available memapi.Bytes, format string, args ...any) error {
	return &memapi.Error{
		Op:        op,
		Kind:      kind,
		Mechanism: m.info.Mechanism,
		Authority: m.info.Authority,
		Handle:    h,
		Wanted:    wanted,
		Available: available,
		Detail:    fmt.Sprintf(format, args...),
	}
}

// fault asks Options.Faults whether the kernel call name, made by the
// contract operation op about n bytes, fails: its error then stands for the
// kernel's, marked injected. Without an injector it is one nil check
// (inlined).
func (m *Mechanism) fault(op, name string, n uintptr) error {
	if m.faults == nil {
		return nil
	}
	return m.injected(op, name, n)
}

func (m *Mechanism) injected(op, name string, n uintptr) error {
	err := m.faults.MaybeError(memapi.Op{Layer: Layer, Name: name, Bytes: memapi.Bytes(n), Authority: m.info.Authority, Args: op})
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w (%w)", err, memapi.ErrInjected)
}

// errno wraps a kernel error: out-of-memory errnos (ENOMEM, EAGAIN, ENOSPC,
// EFAULT from a populate that could not fault a page in) become
// ErrOutOfMemory, and so does an injected ErrOutOfMemory; anything else the
// given kind. The errno stays reachable through errors.Is.
func (m *Mechanism) errno(op string, kind error, err error, detail string) error {
	if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EFAULT) ||
		errors.Is(err, memapi.ErrOutOfMemory) {
		kind = memapi.ErrOutOfMemory
	}
	return &memapi.Error{
		Op:        op,
		Kind:      kind,
		Mechanism: m.info.Mechanism,
		Authority: m.info.Authority,
		Detail:    detail,
		Err:       err,
	}
}

// checkSize validates a requested size and rounds it up to g.
func (m *Mechanism) checkSize(op string, size, g memapi.Bytes) (memapi.Bytes, error) {
	if size == 0 {
		return 0, m.fail(op, memapi.ErrInvalidSize, 0, 0, 0, "zero size")
	}
	n, ok := memapi.RoundUp(size, g)
	if !ok || n > maxSize {
		return 0, m.fail(op, memapi.ErrInvalidSize, 0, size, maxSize, "larger than the address space")
	}
	return n, nil
}

// checkRange validates r against a reservation of size bytes.
func (m *Mechanism) checkRange(op string, r memapi.Range, res *memapi.Reservation) error {
	if !r.Within(res.Size()) {
		return m.fail(op, memapi.ErrInvalidRange, res.ID(), r.Len, res.Size(), "range %v is empty or outside the reservation", r)
	}
	if !r.Aligned(memapi.Bytes(m.gran)) {
		return m.fail(op, memapi.ErrUnaligned, res.ID(), r.Len, 0, "range %v is not aligned to the %d-byte granularity", r, m.gran)
	}
	return nil
}

func (m *Mechanism) noGrant(op string) error {
	return m.fail(op, memapi.ErrNoGrant, 0, 0, 0, "a consuming call needs a grant")
}
