//go:build memgentmpl

package fakes

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// Config configures a fake mechanism. The zero Config is a complete fake
// named "fake" of authority "fake" on host device 0, offering every
// capability, with 4 KiB allocation granularity, 64 KiB granularity and no
// capacity limit.
type Config struct {
	Name      memapi.MechanismID // default "fake"; also the Source of its recorded calls
	Authority memapi.AuthorityID // default "fake"
	Device    memapi.DeviceKey   // default host device 0
	// Offers are the capabilities the fake offers; 0 means every capability.
	// The required capabilities are always offered. The accessors of the
	// others report absence and their methods fail with ErrUnsupported.
	Offers           memapi.CapSet
	AllocGranularity memapi.Bytes // default 4096; a power of two
	Granularity      memapi.Bytes // default 65536; a power of two
	// Capacity limits the physical bytes held at once (UsedBytes); a call
	// that would exceed it fails with ErrOutOfMemory. 0 means unlimited.
	Capacity memapi.Bytes
	// LyingEager reproduces an eager allocator that lies about commits:
	// Reserve takes the whole physical size at once (UsedBytes and Capacity
	// see it), Commit and Decommit validate their arguments and then do
	// nothing, and CommittedBytes never moves. The checked wrapper's verify
	// mode reports such a commit as ErrUntruthful.
	LyingEager bool
	// Recorder, when set, receives every call of the fake and of the device
	// contexts made over it.
	Recorder *Recorder
	// Quiet keeps call counts but not call arguments, for benchmarks and long
	// runs; ArgsForCall then panics.
	Quiet bool
}

// maxObjectSize bounds one allocation, reservation or backing: larger sizes
// are "absurd" (ErrInvalidSize), like a device that cannot address them.
const maxObjectSize = 1 << 48

// addrBase is the first synthetic device address of every fake. Addresses
// are handed out upwards and never reused, with one granule of guard between
// objects, so a copy that runs off the end of one object never lands in the
// next.
const addrBase = 0x100000000000

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "fake"
	}
	if c.Authority == "" {
		c.Authority = "fake"
	}
	if c.Device == (memapi.DeviceKey{}) {
		c.Device = memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	}
	if c.AllocGranularity == 0 {
		c.AllocGranularity = 4096
	}
	if c.Granularity == 0 {
		c.Granularity = 65536
	}
	if c.Offers == 0 {
		c.Offers = memapi.Of(memapi.Capabilities...)
	}
	for _, cm := range memapi.Meta.Capabilities {
		if cm.Required {
			c.Offers |= memapi.Of(cm.Capability)
		}
	}
	for _, g := range []memapi.Bytes{c.AllocGranularity, c.Granularity} {
		if g&(g-1) != 0 {
			panic(fmt.Sprintf("fakes: granularity %d is not a power of two", g))
		}
	}
	return c
}

// mechanismState is the stateful model behind Mechanism: host memory behind
// handles and the accounting of the spec. One mutex guards it all.
type mechanismState struct {
	cfg    Config
	info   memapi.MechanismInfo
	issuer *memapi.Issuer

	mu   sync.Mutex
	used memapi.Bytes
	next uint64    // next free synthetic address
	objs []*object // live address ranges, sorted by base
	live int       // live handles
}

// object is one live address range: an allocation or a reservation.
type object struct {
	base, size uint64
	r          region
}

// region is what lies behind an object's addresses.
type region interface {
	// segments appends the stores behind [off, off+n) of the object at base
	// (the caller has checked the bounds), or fails as resolve does.
	segments(s *mechanismState, op string, base, off, n uint64, write bool, buf segments) (segments, error)
}

type allocState struct {
	obj *object
	mem *store
}

func (a *allocState) segments(
	_ *mechanismState,
	_ string,
	_,
	off,
	n uint64,
	_ bool,
	buf segments,
) (segments, error) {
	return append(buf, segment{st: a.mem, off: off, n: n}), nil
}

func (s *mechanismState) init(cfg Config) {
	s.cfg = cfg
	s.issuer = memapi.NewIssuer()
	s.next = addrBase
	s.info = memapi.MechanismInfo{
		Mechanism:        cfg.Name,
		Instance:         s.issuer.Instance(),
		Device:           cfg.Device,
		Authority:        cfg.Authority,
		AllocGranularity: cfg.AllocGranularity,
		Granularity:      cfg.Granularity,
	}
}

// offers reports whether the fake was configured with capability c.
func (m *Mechanism) offers(c memapi.Capability) bool { return m.state.cfg.Offers.Has(c) }

// errorf returns an *memapi.Error naming the fake.
func (s *mechanismState) errorf(
	op string,
	kind error,
	h memapi.HandleID,
	format string,
	args ...any,
) *memapi.Error {
	return &memapi.Error{
		Op:        op,
		Kind:      kind,
		Mechanism: s.cfg.Name,
		Authority: s.cfg.Authority,
		Handle:    h,
		Detail:    fmt.Sprintf(format, args...),
	}
}

// fill adds the fake's names to an *memapi.Error from the Issuer.
func (s *mechanismState) fill(err error) error {
	var me *memapi.Error
	if errors.As(err, &me) && me.Mechanism == "" {
		me.Mechanism, me.Authority = s.cfg.Name, s.cfg.Authority
	}
	return err
}

func (s *mechanismState) ctxErr(op string, ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return &memapi.Error{
			Op:        op,
			Mechanism: s.cfg.Name,
			Authority: s.cfg.Authority,
			Detail:    "context done",
			Err:       err,
		}
	}
	return nil
}

// size rounds n up to g and rejects zero and absurd sizes.
func (s *mechanismState) size(op string, n, g memapi.Bytes) (memapi.Bytes, error) {
	if n == 0 {
		return 0, s.errorf(op, memapi.ErrInvalidSize, 0, "size 0")
	}
	r, ok := memapi.RoundUp(n, g)
	if !ok || r > maxObjectSize {
		return 0, s.errorf(
			op,
			memapi.ErrInvalidSize,
			0,
			"size %d is larger than the fake's limit %d",
			n,
			uint64(maxObjectSize),
		)
	}
	return r, nil
}

// charge checks that n more physical bytes fit the capacity. Callers hold mu
// and add n to used only once nothing else can fail.
func (s *mechanismState) charge(op string, n memapi.Bytes) error {
	if c := s.cfg.Capacity; c != 0 && (s.used > c || n > c-s.used) {
		e := s.errorf(op, memapi.ErrOutOfMemory, 0, "capacity %d exhausted", c)
		e.Wanted, e.Available = n, c-min(c, s.used)
		return e
	}
	return nil
}

// place finds address space for size bytes aligned to align (a power of two)
// and records the object. Callers hold mu.
func (s *mechanismState) place(op string, o *object, size, align uint64) error {
	base := (s.next + align - 1) &^ (align - 1)
	end := base + size
	guard := uint64(s.cfg.Granularity)
	if base < s.next || end < base || end+guard < end {
		return s.errorf(op, memapi.ErrOutOfMemory, 0, "synthetic address space exhausted")
	}
	o.base, o.size = base, size
	s.next = end + guard
	s.objs = append(s.objs, o) // addresses only grow: objs stays sorted
	return nil
}

func (s *mechanismState) unplace(o *object) {
	i := sort.Search(len(s.objs), func(i int) bool { return s.objs[i].base >= o.base })
	if i < len(s.objs) && s.objs[i] == o {
		s.objs = append(s.objs[:i], s.objs[i+1:]...)
	}
}

// Info describes the fake.
func (s *mechanismState) Info() memapi.MechanismInfo { return s.info }

// Allocate gives host memory at a fresh synthetic address.
func (s *mechanismState) Allocate(
	ctx context.Context,
	req memapi.AllocRequest,
	grant memapi.Grant,
) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, s.errorf(op, memapi.ErrNoGrant, 0, "a consuming call needs a grant")
	}
	if err := s.ctxErr(op, ctx); err != nil {
		return nil, err
	}
	if req.Align&(req.Align-1) != 0 {
		return nil, s.errorf(op, memapi.ErrInvalidSize, 0, "alignment %d is not a power of two", req.Align)
	}
	size, err := s.size(op, req.Size, s.cfg.AllocGranularity)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.charge(op, size); err != nil {
		return nil, err
	}
	st := &allocState{mem: newStore(uint64(size))}
	st.obj = &object{r: st}
	if err := s.place(op, st.obj, uint64(size), max(uint64(req.Align), uint64(s.cfg.AllocGranularity))); err != nil {
		return nil, err
	}
	s.used += size
	s.live++
	return s.issuer.NewAllocation(memapi.DeviceAddr(st.obj.base), size, st), nil
}

// Free returns an allocation's memory; its bytes are gone.
func (s *mechanismState) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	const op = "DeviceAllocator.Free"
	s.mu.Lock()
	defer s.mu.Unlock()
	impl, err := s.issuer.BeginRelease(op, a)
	if err != nil {
		return s.fill(err)
	}
	st := impl.(*allocState)
	s.unplace(st.obj)
	s.used -= a.Size()
	s.live--
	s.issuer.EndRelease(a, true)
	return nil
}

// UsedBytes is allocations + committed chunks + backings (+ whole
// reservations when lying eager).
func (s *mechanismState) UsedBytes() memapi.Bytes {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// resolve maps [addr, addr+n) to the stores behind it. It fails with
// ErrInvalidRange where no live object covers the bytes, ErrNotCommitted
// where a reservation has no backing, and ErrReadOnly when write is set and a
// read-only view covers them. Callers hold mu.
func (s *mechanismState) resolve(
	op string,
	addr memapi.DeviceAddr,
	n uint64,
	write bool,
	buf segments,
) (segments, error) {
	if n == 0 {
		return buf, nil
	}
	a := uint64(addr)
	i := sort.Search(len(s.objs), func(i int) bool { return s.objs[i].base > a }) - 1
	if i < 0 || a >= s.objs[i].base+s.objs[i].size {
		return nil, s.errorf(op, memapi.ErrInvalidRange, 0, "no live memory at %#x", a)
	}
	o := s.objs[i]
	end := a + n
	if end < a || end > o.base+o.size {
		return nil, s.errorf(
			op,
			memapi.ErrInvalidRange,
			0,
			"%d bytes at %#x run past the end of the object at %#x (%d bytes)",
			n,
			a,
			o.base,
			o.size,
		)
	}
	return o.r.segments(s, op, o.base, a-o.base, n, write, buf)
}

// ReadMemory copies the device memory at addr into p, as a device read
// would, without recording a call. It fails like a copy from the device.
func (m *Mechanism) ReadMemory(addr memapi.DeviceAddr, p []byte) error {
	s := &m.state
	s.mu.Lock()
	defer s.mu.Unlock()
	segs, err := s.resolve("fakes.ReadMemory", addr, uint64(len(p)), false, nil)
	if err != nil {
		return err
	}
	segs.read(p)
	return nil
}

// WriteMemory copies p into the device memory at addr, as a device write
// would (read-only views refuse it with ErrReadOnly), without recording a
// call.
func (m *Mechanism) WriteMemory(addr memapi.DeviceAddr, p []byte) error {
	s := &m.state
	s.mu.Lock()
	defer s.mu.Unlock()
	segs, err := s.resolve("fakes.WriteMemory", addr, uint64(len(p)), true, nil)
	if err != nil {
		return err
	}
	segs.write(p)
	return nil
}

// LiveHandles reports how many handles the fake created that are not yet
// released: a leak check for tests.
func (m *Mechanism) LiveHandles() int {
	m.state.mu.Lock()
	defer m.state.mu.Unlock()
	return m.state.live
}

// Recorder returns the Recorder the fake records into, or nil.
func (m *Mechanism) Recorder() *Recorder { return m.rec }

// NewMechanism returns a fake mechanism configured by cfg (see Config for
// the defaults). It panics when a granularity is not a power of two.
func NewMechanism(cfg Config) *Mechanism {
	cfg = cfg.withDefaults()
	m := &Mechanism{source: string(cfg.Name), rec: cfg.Recorder, quiet: cfg.Quiet, faults: &faults{}}
	m.state.init(cfg)
	m.faults.init(m.source, mechanismFaultMethods)
	return m
}

// Declaration is what the fake declares itself to be, as the spec declares
// a real mechanism: its configured name, device kind and capabilities, and
// granularity kind "device" (its granularities are what its Config says, as
// a device's are what the device reports). The conformance suite checks the
// fake against it; a mechanism with no declaration fails spec/name.
func (m *Mechanism) Declaration() memapi.MechanismMeta {
	cfg := m.state.cfg
	return memapi.MechanismMeta{
		Name:        cfg.Name,
		Type:        "Mechanism",
		Device:      cfg.Device.Kind.String(),
		Offers:      cfg.Offers,
		Granularity: "device",
		Doc:         "A stateful fake, configured by fakes.Config.",
	}
}

// absent is the error of a method of a capability the fake is configured
// without: absent, never a silent no-op.
func (m *Mechanism) absent(capability, method string) error {
	return &memapi.Error{
		Op:        capability + "." + method,
		Kind:      memapi.ErrUnsupported,
		Mechanism: m.state.cfg.Name,
		Authority: m.state.cfg.Authority,
		Detail:    "the fake is configured without " + capability,
	}
}
