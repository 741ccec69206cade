package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
)

// Options configures a Mechanism.
type Options struct {
	// Authority the plugin's memory is accounted to; "" means "host" for a
	// plugin serving host memory and "<name>:<ordinal>" otherwise.
	Authority memapi.AuthorityID
	// Config is the configuration string passed to the plugin's open slot:
	// comma-separated key=value pairs whose keys the plugin defines (such as
	// "granularity=65536"), at most MaxConfig bytes, no NUL.
	Config string
	// SlotTimeout bounds a consuming slot (allocate, commit, create_backing,
	// copy_on_write) when the call's context has no earlier deadline; 0
	// means DefaultSlotTimeout. The slot receives the deadline; a C slot
	// cannot be preempted, so one that returns past it is reported (see
	// OverrunError) after the fact.
	SlotTimeout time.Duration
	// Verify makes every mutating call compare the plugin's used_bytes with the sum
	// of the host's live handles (allocation and backing sizes, committed
	// bytes of reservations) plus the quarantined bytes, failing with
	// ErrUntruthful when they differ. Mutating calls are serialized so the
	// comparison is exact.
	Verify bool
	// Logger receives a line per overrun slot and per protocol violation;
	// nil means slog.Default().
	Logger *slog.Logger
	// Watchdog, when set, bounds every call into the plugin's C code (see
	// Watchdog): for a host that runs the plugin in a process of its own,
	// as memgen plugin-check does.
	Watchdog *Watchdog
	// GuardPages places every buffer a slot writes or a copy reads (the
	// out structs, the copies' host buffers) at the end of a page followed
	// by an inaccessible one, so that a plugin writing past it faults at
	// once instead of corrupting the host's memory; guarded copies are
	// synchronized before they return. It costs system calls on every such
	// slot: it is for plugin-check, which runs the plugin in a child
	// process, not for production.
	GuardPages bool
	// Faults, when set, is asked before every call of a slot whose
	// failure the host handles (open, and every slot but close,
	// last_error, used_bytes and fence_release), with
	//
	//	memapi.Op{Layer: "plugin", Name: slot, Bytes: n, Authority: a, Args: op}
	//
	// where slot is the slot's C name ("commit"), n the bytes the call is
	// about (0 where it has none) and op the contract operation making it
	// ("VirtualBacking.Commit"). An error makes the host skip the slot and
	// go on as if the plugin had failed it: an *memapi.Error given is the
	// call's error as is; an error of a kind the ABI has a status for is
	// the error of that status (with memapi.ErrInjected as its cause); any
	// other error is the Kind of such an error. Without an injector each
	// call costs one nil check.
	Faults memapi.Injector
}

// Layer is the memapi.Op.Layer of the host's calls into a plugin.
const Layer = "plugin"

// DefaultSlotTimeout bounds a consuming slot when neither the call's context
// nor Options.SlotTimeout gives a deadline.
const DefaultSlotTimeout = 10 * time.Second

// MaxConfig is the longest configuration string open accepts.
const MaxConfig = 4096

// Mechanism is one instance of a plugin presented as a memapi.Mechanism. The
// host owns the handles: it assigns every new handle's id (a process-wide
// counter, never reused) before the slot that creates it, keeps its own table
// of live ids with their bytes, refuses nil, foreign and released handles
// before any slot is called, and moves each handle from live to released
// exactly once, so a plugin sees only live ids of its own instance and each
// release once. The plugin never sees a grant or an account; run the
// mechanism through checked.Wrap, which draws and refunds around every call,
// as for any mechanism (the mechanism draws from a call's grant itself only
// the bytes it quarantined in that call).
//
// What the plugin returns is checked before it becomes a handle: the id must
// be the one assigned, sizes and fields what was asked for; otherwise the
// call fails with ErrProtocol, after giving back through the plugin what it
// created under the assigned id (an object filed under an id of the
// plugin's own is never released: that id may name another object). An id
// the host holds live that the plugin no longer knows (ErrReleased from the
// plugin) is a protocol error too. Memory that cannot be given back is
// quarantined: it stays in the host's table, counted by Quarantined and
// expected in used_bytes, until the instance closes (the plugin's close
// frees whatever is left); a consuming call draws what it quarantined from
// its grant, so the governor sees it. A Mechanism is safe for concurrent
// use.
type Mechanism struct {
	lib     *Library
	info    memapi.MechanismInfo
	issuer  *memapi.Issuer
	inst    uintptr // the plugin's instance pointer
	timeout time.Duration
	verify  bool
	log     *slog.Logger
	watch   *Watchdog
	guard   bool
	faults  memapi.Injector // Options.Faults, or nil

	// life guards inst: every call holds it for reading, Close for writing.
	life   sync.RWMutex
	closed bool

	// vmu serializes mutating calls in verify mode.
	vmu sync.Mutex

	mu sync.Mutex // guards the table (its list and every entry's fields) and quarantined
	// table is the host's table of live ids: a list of the entries, each
	// of which is also the Impl of its handle, so a call finds its entry
	// through the handle and adding or dropping one is a link or an unlink.
	table       *entry
	quarantined memapi.Bytes
	// charged is the part of quarantined that the mechanism drew from the
	// grant of the call that made it (quarantineCharged): UsedBytes leaves
	// it out, so that no wrapper charges it a second time.
	charged memapi.Bytes
	// disowned counts the table's quarantined entries: while it is 0 a
	// handle's entry needs no look under the lock before a slot (the fast
	// path).
	disowned atomic.Int64

	overruns  atomic.Uint64
	protocols atomic.Uint64
}

// entry is the host's record of one id it assigned, and the Impl of the
// handle it was assigned to. Its fields after id are guarded by the
// mechanism's mu.
type entry struct {
	id          uint64
	kind        int
	bytes       memapi.Bytes // allocation and backing: size; reservation: committed
	quarantined bool
	inTable     bool // linked in the table: live, or quarantined, until released or Close
	prev, next  *entry
}

// entryOf is the entry behind a handle's Impl.
func entryOf(impl any) *entry { return impl.(*entry) }

// The kinds of ids the host assigns.
const (
	kindAllocation = iota
	kindReservation
	kindBacking
	kindView
	numKinds
)

// nextID is the last id the host assigned, process-wide. Ids start high so
// that a plugin numbering its own objects from 1 never names one of them.
var nextID atomic.Uint64

func init() { nextID.Store(1 << 40) }

func newID() uint64 { return nextID.Add(1) }

// New opens the plugin at path (see Open, with opts) and makes an instance
// of it.
func New(path string, o Options, opts ...OpenOption) (*Mechanism, error) {
	l, err := Open(path, opts...)
	if err != nil {
		return nil, err
	}
	return l.New(o)
}

// New makes an instance of the plugin (its open slot, given o.Config). It
// fails with a *LoadError of kind ErrBadDescriptor when the configuration is
// too long or holds a NUL, when open fails (the plugin's message, if any,
// is in the error) or returns no instance or granularities that are not
// powers of two.
func (l *Library) New(o Options) (*Mechanism, error) {
	if len(o.Config) > MaxConfig {
		return nil, loadErr(l.Path, ErrBadDescriptor, "the configuration is %d bytes, more than %d", len(o.Config), MaxConfig)
	}
	cfg := make([]byte, len(o.Config)+1)
	copy(cfg, o.Config)
	for _, c := range cfg[:len(o.Config)] {
		if c == 0 {
			return nil, loadErr(l.Path, ErrBadDescriptor, "the configuration holds a NUL byte")
		}
	}
	out := cOpenOut{AllocGranularity: l.desc.AllocGranularity, Granularity: l.desc.Granularity, Ordinal: l.desc.Ordinal}
	is := memapi.NewIssuer()
	m := &Mechanism{lib: l, issuer: is, timeout: o.SlotTimeout, verify: o.Verify, log: o.Logger, watch: o.Watchdog, guard: o.GuardPages, faults: o.Faults}
	if m.timeout <= 0 {
		m.timeout = DefaultSlotTimeout
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.info = memapi.MechanismInfo{Mechanism: l.Name, Instance: is.Instance()}
	if m.faults != nil {
		if err := m.fault("plugin.New", 0, l.desc.Open, 0); err != nil {
			return nil, &LoadError{Path: l.Path, Kind: ErrBadDescriptor, Detail: fmt.Sprintf("open(%q) failed", o.Config), Err: err}
		}
	}
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	r, msg, err := m.callStatus(l.desc.Open, uintptr(unsafe.Pointer(&cfg[0])), uintptr(outp))
	back()
	if err != nil {
		return nil, &LoadError{Path: l.Path, Kind: ErrBadDescriptor, Detail: "open", Err: err}
	}
	if err := m.statusError("plugin.New", r, 0, msg); err != nil {
		return nil, &LoadError{Path: l.Path, Kind: ErrBadDescriptor, Detail: fmt.Sprintf("open(%q) failed", o.Config), Err: err}
	}
	if out.Instance == 0 {
		return nil, loadErr(l.Path, ErrBadDescriptor, "open returned MEMGEN_OK and no instance")
	}
	m.inst = out.Instance
	if !pow2(out.AllocGranularity) || out.Granularity != 0 && !pow2(out.Granularity) || out.Granularity == 0 && l.offers != memapi.Of(memapi.CapDeviceAllocator) {
		_, _ = m.call(l.desc.Close, m.inst)
		return nil, loadErr(l.Path, ErrBadDescriptor, "open(%q) set alloc_granularity %d and granularity %d: not powers of two", o.Config, out.AllocGranularity, out.Granularity)
	}
	a := o.Authority
	if a == "" {
		if l.Device.Kind == memapi.DeviceKindHost {
			a = "host"
		} else {
			a = memapi.AuthorityID(fmt.Sprintf("%s:%d", l.Name, out.Ordinal))
		}
	}
	m.info = memapi.MechanismInfo{
		Mechanism:        l.Name,
		Instance:         is.Instance(),
		Device:           memapi.DeviceKey{Kind: l.Device.Kind, Ordinal: int(out.Ordinal)},
		Authority:        a,
		AllocGranularity: memapi.Bytes(out.AllocGranularity),
		Granularity:      memapi.Bytes(out.Granularity),
	}
	if m.verify {
		if err := m.audit("plugin.New"); err != nil {
			_, _ = m.call(l.desc.Close, m.inst)
			return nil, &LoadError{Path: l.Path, Kind: ErrBadDescriptor, Detail: "a fresh instance", Err: err}
		}
	}
	return m, nil
}

// Declaration is the plugin's declaration (Library.Declaration): the
// conformance suite checks a bare instance against it.
func (m *Mechanism) Declaration() memapi.MechanismMeta { return m.lib.Declaration() }

// Library returns the plugin the instance belongs to.
func (m *Mechanism) Library() *Library { return m.lib }

// Info describes the instance: the plugin's name, device and granularities
// (as open set them).
func (m *Mechanism) Info() memapi.MechanismInfo { return m.info }

// Quarantined returns the bytes the host keeps accounted for memory the
// plugin holds but that no handle can release (it broke the protocol): the
// objects it made that the host refused, and the handles whose ids it
// disowned or reused. They are part of what used_bytes must report, and are
// freed when the instance closes.
func (m *Mechanism) Quarantined() memapi.Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.quarantined
	for e := m.table; e != nil; e = e.next {
		if e.quarantined {
			n += e.bytes
		}
	}
	return n
}

// Overruns returns how many consuming slots of the instance returned past
// their deadline.
func (m *Mechanism) Overruns() uint64 { return m.overruns.Load() }

// ProtocolErrors returns how many calls of the instance failed with
// ErrProtocol.
func (m *Mechanism) ProtocolErrors() uint64 { return m.protocols.Load() }

// offers reports whether the instance offers c.
func (m *Mechanism) offers(c memapi.Capability) bool { return m.lib.offers.Has(c) }

// AsVirtualBacking returns the VirtualBacking capability when the plugin has
// all its slots (and the allow-list, if any, lists it).
func (m *Mechanism) AsVirtualBacking() (memapi.VirtualBacking, bool) {
	if !m.offers(memapi.CapVirtualBacking) {
		return nil, false
	}
	return m, true
}

// AsSharedMapping returns the SharedMapping capability when the plugin has
// all its slots (and the allow-list, if any, lists it).
func (m *Mechanism) AsSharedMapping() (memapi.SharedMapping, bool) {
	if !m.offers(memapi.CapSharedMapping) {
		return nil, false
	}
	return m, true
}

// enter holds the instance open for one call (and, in verify mode, for a
// mutating one, serializes it); leave ends it, auditing in verify mode.
func (m *Mechanism) enter(op string) error {
	m.life.RLock()
	if m.closed {
		m.life.RUnlock()
		return &memapi.Error{Op: op, Kind: memapi.ErrClosed, Mechanism: m.info.Mechanism}
	}
	return nil
}

func (m *Mechanism) leave() { m.life.RUnlock() }

// mutate is enter for a call that changes state; done ends it and returns
// err joined with the verify-mode audit's finding.
func (m *Mechanism) mutate(op string) error {
	if err := m.enter(op); err != nil {
		return err
	}
	if m.verify {
		m.vmu.Lock()
	}
	return nil
}

func (m *Mechanism) done(op string, err error) error {
	if m.verify {
		if aerr := m.audit(op); aerr != nil {
			err = joinErr(err, aerr)
		}
		m.vmu.Unlock()
	}
	m.leave()
	return err
}

// audit compares used_bytes with what the host's table says the plugin
// holds.
func (m *Mechanism) audit(op string) error {
	r, err := m.call(m.lib.da.UsedBytes, m.inst)
	if err != nil {
		return m.protocol(op, 0, "used_bytes: %v", err)
	}
	want := m.held()
	if got := memapi.Bytes(r); got != want {
		return &memapi.Error{Op: op, Kind: memapi.ErrUntruthful, Mechanism: m.info.Mechanism, Authority: m.info.Authority,
			Wanted: want, Available: got,
			Detail: fmt.Sprintf("used_bytes reports %d bytes, but the live handles hold %d (quarantined included)", got, want)}
	}
	return nil
}

// held is the sum of the bytes of every id in the host's table.
func (m *Mechanism) held() memapi.Bytes {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n memapi.Bytes
	for e := m.table; e != nil; e = e.next {
		n += e.bytes
	}
	return n + m.quarantined
}

// callStatus calls a slot returning a status on a locked OS thread, and
// when it failed asks last_error on the same thread for the message.
//
//go:uintptrescapes
func (m *Mechanism) callStatus(fn uintptr, args ...uintptr) (int32, string, error) {
	return m.callStatusInts(fn, args...)
}

// callStatusInts is callStatus for arguments that point to no Go memory
// (see callInts), or that a go:uintptrescapes caller keeps.
func (m *Mechanism) callStatusInts(fn uintptr, args ...uintptr) (int32, string, error) {
	if m.lib.desc.LastError == 0 {
		r, err := m.call(fn, args...)
		return int32(r), "", err
	}
	lockThread()
	defer unlockThread()
	r, err := m.call(fn, args...)
	if err != nil || int32(r) == 0 {
		return int32(r), "", err
	}
	return int32(r), m.lastError(), nil
}

// call is callInts for the instance: under the watchdog, when there is one.
func (m *Mechanism) call(fn uintptr, args ...uintptr) (uintptr, error) {
	if m.watch == nil {
		return callInts(fn, args...)
	}
	defer m.watch.begin(m.lib, fn).Stop()
	return callInts(fn, args...)
}

// lastError reads the plugin's last_error on this thread.
func (m *Mechanism) lastError() string {
	var buf [512]byte
	p, back := m.guarded(unsafe.Pointer(&buf[0]), uintptr(len(buf)))
	n, err := m.call(m.lib.desc.LastError, m.inst, uintptr(p), uintptr(len(buf)))
	back()
	if err != nil || n == 0 {
		return ""
	}
	n = min(n, uintptr(len(buf)-1))
	b := buf[:n]
	for i, c := range b {
		if c == 0 {
			b = b[:i]
			break
		}
	}
	return string(b)
}

// slot calls a slot returning a status and turns the result into the
// contract's error.
//
//go:uintptrescapes
func (m *Mechanism) slot(op string, h memapi.HandleID, n memapi.Bytes, fn uintptr, args ...uintptr) error {
	return m.slotInts(op, h, n, fn, args...)
}

// slot4 is slot for the four arguments of a consuming slot (the instance,
// the deadline, then two more). With fixed parameters go:uintptrescapes
// keeps what they point to on the heap for the call without putting the
// argument list there as well: one allocation fewer per call than slot.
//
//go:uintptrescapes
func (m *Mechanism) slot4(op string, h memapi.HandleID, n memapi.Bytes, fn, a0, a1, a2, a3 uintptr) error {
	return m.slotInts(op, h, n, fn, a0, a1, a2, a3)
}

// slotInts is slot for arguments that point to no Go memory (see callInts),
// or that a go:uintptrescapes caller keeps: the argument list stays on the
// stack, where slot's goes to the heap. n is the bytes the call is about,
// for the fault injector.
func (m *Mechanism) slotInts(op string, h memapi.HandleID, n memapi.Bytes, fn uintptr, args ...uintptr) error {
	if m.faults != nil {
		if err := m.fault(op, h, fn, n); err != nil {
			return err
		}
	}
	r, msg, err := m.callStatusInts(fn, args...)
	if err != nil {
		return m.protocol(op, h, "%v", err)
	}
	return m.statusError(op, r, h, msg)
}

// deadline returns the window of a consuming slot starting now: it ends
// Options.SlotTimeout from now, or at the context's deadline when that is
// sooner. A context that already ended (cancelled, or its deadline not after
// now) gets no window: the slot is not called, and the error is an
// *memapi.Error of kind ErrUnavailable (the status a slot returns past its
// deadline) wrapping the context's error. One read of the monotonic clock.
func (m *Mechanism) deadline(op string, ctx context.Context) (window, error) {
	now := time.Since(timeBase)
	w := window{start: now, end: now + m.timeout}
	if w.end < now { // a SlotTimeout near the largest Duration
		w.end = math.MaxInt64
	}
	if d, ok := ctx.Deadline(); ok {
		w.end = min(w.end, d.Sub(timeBase))
	}
	err := ctx.Err()
	if err == nil && w.end <= now {
		err = context.DeadlineExceeded // passed, and the context's timer has not fired yet
	}
	if err != nil {
		return window{}, &memapi.Error{Op: op, Kind: memapi.ErrUnavailable, Mechanism: m.info.Mechanism, Authority: m.info.Authority,
			Detail: "the call's context ended before the slot was called", Err: err}
	}
	return w, nil
}

// overran reports a consuming slot that returned past the end of its window:
// the counter, a log line, and the typed error the call returns.
func (m *Mechanism) overran(op string, w window) error {
	m.overruns.Add(1)
	e := &OverrunError{Op: op, Mechanism: m.info.Mechanism, Budget: w.end - w.start, Took: time.Since(timeBase) - w.start}
	m.log.Warn("memgen plugin: a slot overran its deadline", "plugin", string(m.info.Mechanism), "op", op,
		"budget", e.Budget, "took", e.Took)
	return e
}

// adoptNew records id, which the host assigned, as a new handle of kind k
// holding n bytes, and returns its entry (the handle's Impl).
func (m *Mechanism) adoptNew(k int, id uint64, n memapi.Bytes) *entry {
	e := &entry{id: id, kind: k, bytes: n, inTable: true}
	m.mu.Lock()
	e.next = m.table
	if m.table != nil {
		m.table.prev = e
	}
	m.table = e
	m.mu.Unlock()
	return e
}

// unlink drops e from the table; m.mu is held.
func (m *Mechanism) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		m.table = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	}
	e.prev, e.next, e.inTable = nil, nil, false
}

// liveEntry returns the entry of id in the table, or nil (an error path: it
// walks the table).
func (m *Mechanism) liveEntry(id uint64) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	for e := m.table; e != nil; e = e.next {
		if e.id == id {
			return e
		}
	}
	return nil
}

// isDisowned reports whether the entry of a live handle is quarantined (or
// no longer in the table); while no entry is quarantined, without the lock.
func (m *Mechanism) isDisowned(e *entry) bool {
	if m.disowned.Load() == 0 {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return !e.inTable || e.quarantined
}

// forget drops a released entry.
func (m *Mechanism) forget(e *entry) {
	m.mu.Lock()
	if e.inTable {
		if e.quarantined {
			m.disowned.Add(-1)
		}
		m.unlink(e)
	}
	m.mu.Unlock()
}

// quarantine moves e's bytes (or, when e is nil, n bytes of something that
// has no entry) to the quarantine: they stay accounted, and the id is never
// passed to the plugin again.
func (m *Mechanism) quarantine(e *entry, n memapi.Bytes) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e != nil && e.inTable {
		if !e.quarantined {
			e.quarantined = true
			m.disowned.Add(1)
		}
		return
	}
	m.quarantined += n
}

// quarantineCharged quarantines n bytes of an object a consuming call made
// and the host refused, and draws them from the call's grant: the checked
// wrapper gives back what it drew for a call that failed, so without this
// draw the governor would not see memory the plugin still holds. Bytes so
// drawn are left out of UsedBytes, which a wrapper in verify mode settles
// on, so they are charged exactly once. When the grant refuses, the bytes
// stay in UsedBytes and the grant's error is returned.
func (m *Mechanism) quarantineCharged(grant memapi.Grant, n memapi.Bytes) error {
	if n == 0 {
		return nil
	}
	var err error
	if grant != nil {
		err = grant.Draw(n)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.quarantined += n
	if grant != nil && err == nil {
		m.charged += n
	}
	return err
}

// giveBack releases through slot fn what a creating slot made under id when
// the host refuses it; what the plugin will not release is quarantined and
// charged to the call's grant (nil for a call that consumes nothing).
func (m *Mechanism) giveBack(op string, fn uintptr, id uint64, n memapi.Bytes, grant memapi.Grant) error {
	if !m.tryRelease(op, fn, id, n) {
		return m.quarantineCharged(grant, n)
	}
	return nil
}

func (m *Mechanism) tryRelease(op string, fn uintptr, id uint64, n memapi.Bytes) bool {
	if m.faults != nil && m.fault(op, 0, fn, n) != nil {
		return false
	}
	r, err := m.call(fn, m.inst, uintptr(id))
	return err == nil && r == 0
}

// changedID checks that the plugin left out->id as assigned. When it did
// not, the plugin filed the object under an id of its own, and nothing is
// released: that id may name another object of the plugin (a quarantined
// one, or the object of a call still running), so releasing it could free
// the wrong memory. The n bytes are quarantined and charged to the call's
// grant; a live handle of that id is quarantined too, since the id now
// names two objects of the plugin and no release of it is safe.
func (m *Mechanism) changedID(op string, assigned, got uint64, n memapi.Bytes, grant memapi.Grant) error {
	if got == assigned {
		return nil
	}
	also := ""
	if e := m.liveEntry(got); e != nil {
		m.quarantine(e, 0)
		also = fmt.Sprintf("; handle %d, whose id it took, is quarantined too", got)
	}
	cerr := m.quarantineCharged(grant, n)
	return joinErr(m.protocol(op, 0, "the plugin changed the assigned id %d to %d: nothing released, %d bytes quarantined%s", assigned, got, n, also), cerr)
}

func (m *Mechanism) noGrant(op string) error {
	return &memapi.Error{Op: op, Kind: memapi.ErrNoGrant, Mechanism: m.info.Mechanism, Detail: "a consuming call needs a grant"}
}

// entryOfLive returns the entry behind a live handle of this instance; a
// quarantined id is refused with ErrProtocol.
func (m *Mechanism) entryOfLive(op string, h memapi.Handle) (*entry, error) {
	impl, err := m.issuer.Impl(op, h)
	if err != nil {
		return nil, err
	}
	e := entryOf(impl)
	if m.isDisowned(e) {
		return nil, m.protocol(op, h.ID(), "handle %d is quarantined: the plugin disowned it", e.id)
	}
	return e, nil
}

// unknown turns a plugin's ErrReleased for an id the host holds live into a
// protocol error and quarantines the id.
func (m *Mechanism) unknown(op string, h memapi.HandleID, e *entry, err error) error {
	if !isKind(err, memapi.ErrReleased) {
		return err
	}
	m.quarantine(e, 0)
	return m.protocol(op, h, "the plugin does not know id %d, which the host holds live: its bytes stay accounted (quarantined) until the instance closes (%v)", e.id, err)
}

// Close destroys the instance (the plugin's close slot, which frees whatever
// is left, quarantined memory included). It fails with ErrInUse, closing
// nothing, while handles of the instance are live and not quarantined; a
// second Close returns nil.
func (m *Mechanism) Close() error {
	m.life.Lock()
	defer m.life.Unlock()
	if m.closed {
		return nil
	}
	m.mu.Lock()
	n := 0
	for e := m.table; e != nil; e = e.next {
		if !e.quarantined {
			n++
		}
	}
	m.mu.Unlock()
	if n > 0 {
		return &memapi.Error{Op: "plugin.Close", Kind: memapi.ErrInUse, Mechanism: m.info.Mechanism,
			Detail: fmt.Sprintf("%d handles are live", n)}
	}
	m.closed = true
	_, err := m.call(m.lib.desc.Close, m.inst)
	m.mu.Lock()
	for m.table != nil {
		m.unlink(m.table)
	}
	m.quarantined, m.charged = 0, 0
	m.disowned.Store(0)
	m.mu.Unlock()
	if err != nil {
		return m.protocol("plugin.Close", 0, "%v", err)
	}
	return nil
}

// maxSize is the largest size a slot is ever asked for (2^48 bytes).
const maxSize = memapi.Bytes(1) << 48

// maxAlign is the largest alignment Allocate accepts.
const maxAlign = memapi.Bytes(1) << 30

func (m *Mechanism) badSize(op string, format string, args ...any) error {
	return &memapi.Error{Op: op, Kind: memapi.ErrInvalidSize, Mechanism: m.info.Mechanism, Detail: fmt.Sprintf(format, args...)}
}

// ---- DeviceAllocator ----------------------------------------------------

// Allocate calls the plugin's allocate slot with a host-assigned id and a
// deadline. The grant must be present but is not drawn from (the checked
// wrapper does that). A size of 0 or over 2^48 bytes and an alignment that
// is not 0 or a power of two of at most 2^30 fail with ErrInvalidSize before
// the plugin is called.
func (m *Mechanism) Allocate(ctx context.Context, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	const op = "DeviceAllocator.Allocate"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	if req.Size == 0 || req.Size > maxSize {
		return nil, m.badSize(op, "size %d is not 1 to 2^48 bytes", req.Size)
	}
	if req.Align != 0 && (!pow2(uint64(req.Align)) || req.Align > maxAlign) {
		return nil, m.badSize(op, "align %d is not 0 or a power of two of at most 2^30", req.Align)
	}
	if err := m.mutate(op); err != nil {
		return nil, err
	}
	a, err := m.allocate(ctx, op, req, grant)
	return a, m.done(op, err)
}

func (m *Mechanism) allocate(ctx context.Context, op string, req memapi.AllocRequest, grant memapi.Grant) (*memapi.Allocation, error) {
	id := newID()
	// The request and the out parameter escape to the heap for the call
	// (go:uintptrescapes): one object for both is one allocation, and slot4
	// adds none for the argument list.
	inout := &struct {
		in  cAllocRequest
		out cAllocationOut
	}{cAllocRequest{Size: uint64(req.Size), Align: uint64(req.Align)}, cAllocationOut{ID: id}}
	out := &inout.out
	w, err := m.deadline(op, ctx)
	if err != nil {
		return nil, err
	}
	outp, back := m.guarded(unsafe.Pointer(out), unsafe.Sizeof(*out))
	err = m.slot4(op, 0, req.Size, m.lib.da.Allocate, m.inst, uintptr(w.ns()), uintptr(unsafe.Pointer(&inout.in)), uintptr(outp))
	back()
	if err != nil {
		return nil, err
	}
	want, _ := memapi.RoundUp(req.Size, m.info.AllocGranularity)
	if err := m.changedID(op, id, out.ID, memapi.Bytes(out.Size), grant); err != nil {
		return nil, err
	}
	if out.Addr == 0 || out.Size != uint64(want) {
		gerr := m.giveBack(op, m.lib.da.Free, id, memapi.Bytes(out.Size), grant)
		return nil, joinErr(m.protocol(op, 0, "the plugin returned an allocation of %d bytes at %#x for a request of %d (want %d)", out.Size, out.Addr, req.Size, want), gerr)
	}
	if w.passed() {
		gerr := m.giveBack(op, m.lib.da.Free, id, want, grant)
		return nil, joinErr(m.overran(op, w), gerr)
	}
	e := m.adoptNew(kindAllocation, id, want)
	return m.issuer.NewAllocation(memapi.DeviceAddr(out.Addr), want, e), nil
}

// Free calls the plugin's free slot. The account is not refunded (the
// checked wrapper does that).
func (m *Mechanism) Free(ctx context.Context, a *memapi.Allocation, to memapi.Account) error {
	const op = "DeviceAllocator.Free"
	return m.release(op, a, m.lib.da.Free)
}

// release runs a releasing slot fn for handle h: the handle moves to
// releasing first, so a racing second release fails with ErrReleased, and
// back to live when the plugin refuses.
func (m *Mechanism) release(op string, h memapi.Handle, fn uintptr) error {
	impl, err := m.issuer.BeginRelease(op, h)
	if err != nil {
		return err
	}
	e := entryOf(impl)
	if m.isDisowned(e) {
		m.issuer.EndRelease(h, false)
		return m.protocol(op, h.ID(), "handle %d is quarantined: the plugin disowned it", e.id)
	}
	if err := m.mutate(op); err != nil {
		m.issuer.EndRelease(h, false)
		return err
	}
	if err := m.slotInts(op, h.ID(), 0, fn, m.inst, uintptr(e.id)); err != nil {
		err = m.unknown(op, h.ID(), e, err)
		m.issuer.EndRelease(h, false)
		return m.done(op, err)
	}
	m.forget(e)
	m.issuer.EndRelease(h, true)
	return m.done(op, nil)
}

// UsedBytes asks the plugin's used_bytes slot, less the quarantined bytes
// the mechanism charged to a grant itself (see Quarantined): what remains is
// what the handles' charges cover, so a checked wrapper in verify mode,
// which settles on this figure, never charges those bytes a second time. 0
// after Close.
func (m *Mechanism) UsedBytes() memapi.Bytes {
	if m.enter("DeviceAllocator.UsedBytes") != nil {
		return 0
	}
	defer m.leave()
	r, err := m.call(m.lib.da.UsedBytes, m.inst)
	if err != nil {
		return 0
	}
	m.mu.Lock()
	charged := m.charged
	m.mu.Unlock()
	return memapi.Bytes(r) - min(charged, memapi.Bytes(r))
}

// ---- VirtualBacking -----------------------------------------------------

// Reserve calls the plugin's reserve slot with a host-assigned id. A size of
// 0 or over 2^48 bytes fails with ErrInvalidSize before the plugin is
// called.
func (m *Mechanism) Reserve(ctx context.Context, req memapi.ReserveRequest) (*memapi.Reservation, error) {
	const op = "VirtualBacking.Reserve"
	if req.Size == 0 || req.Size > maxSize {
		return nil, m.badSize(op, "size %d is not 1 to 2^48 bytes", req.Size)
	}
	if err := m.mutate(op); err != nil {
		return nil, err
	}
	in := cReserveRequest{Size: uint64(req.Size)}
	id := newID()
	out := cReservationOut{ID: id}
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	err := m.slot(op, 0, req.Size, m.lib.vb.Reserve, m.inst, uintptr(unsafe.Pointer(&in)), uintptr(outp))
	back()
	if err != nil {
		return nil, m.done(op, err)
	}
	if err := m.changedID(op, id, out.ID, 0, nil); err != nil {
		return nil, m.done(op, err)
	}
	want, _ := memapi.RoundUp(req.Size, m.info.Granularity)
	if out.Addr == 0 || out.Size != uint64(want) || out.Addr%uint64(m.info.Granularity) != 0 {
		_ = m.giveBack(op, m.lib.vb.ReleaseReservation, id, 0, nil)
		return nil, m.done(op, m.protocol(op, 0, "the plugin returned a reservation of %d bytes at %#x for a request of %d (want %d)", out.Size, out.Addr, req.Size, want))
	}
	e := m.adoptNew(kindReservation, id, 0)
	return m.issuer.NewReservation(memapi.DeviceAddr(out.Addr), want, e), m.done(op, nil)
}

// checkRange refuses a range outside res (ErrInvalidRange) or not aligned to
// the granularity (ErrUnaligned) before the plugin sees it.
func (m *Mechanism) checkRange(op string, res *memapi.Reservation, rg memapi.Range) error {
	if rg.Len == 0 || rg.Off > res.Size() || rg.Len > res.Size()-rg.Off {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Mechanism: m.info.Mechanism, Handle: res.ID(),
			Detail: fmt.Sprintf("range %v is empty or outside the %d-byte reservation", rg, res.Size())}
	}
	if g := m.info.Granularity; rg.Off%g != 0 || rg.Len%g != 0 {
		return &memapi.Error{Op: op, Kind: memapi.ErrUnaligned, Mechanism: m.info.Mechanism, Handle: res.ID(),
			Detail: fmt.Sprintf("range %v is not aligned to %d", rg, g)}
	}
	return nil
}

// Commit calls the plugin's commit slot with a deadline. The grant must be
// present but is not drawn from (the checked wrapper does that, and in
// verify mode checks that CommittedBytes moved by exactly the range).
func (m *Mechanism) Commit(ctx context.Context, res *memapi.Reservation, r memapi.Range, grant memapi.Grant) error {
	const op = "VirtualBacking.Commit"
	if grant == nil {
		return m.noGrant(op)
	}
	if err := m.mutate(op); err != nil {
		return err
	}
	return m.done(op, m.commit(ctx, op, res, r))
}

func (m *Mechanism) commit(ctx context.Context, op string, res *memapi.Reservation, r memapi.Range) error {
	e, err := m.entryOfLive(op, res)
	if err != nil {
		return err
	}
	if err := m.checkRange(op, res, r); err != nil {
		return err
	}
	in := cRange{Off: uint64(r.Off), Len: uint64(r.Len)}
	w, err := m.deadline(op, ctx)
	if err != nil {
		return err
	}
	if err := m.slot4(op, res.ID(), r.Len, m.lib.vb.Commit, m.inst, uintptr(w.ns()), uintptr(e.id), uintptr(unsafe.Pointer(&in))); err != nil {
		return m.unknown(op, res.ID(), e, err)
	}
	if w.passed() {
		if rerr := m.slot(op, res.ID(), r.Len, m.lib.vb.Decommit, m.inst, uintptr(e.id), uintptr(unsafe.Pointer(&in))); rerr != nil {
			m.addCommitted(e, r.Len) // still installed: keep it counted on the reservation
		}
		return m.overran(op, w)
	}
	m.addCommitted(e, r.Len)
	return nil
}

// addCommitted adds n committed bytes to reservation entry e.
func (m *Mechanism) addCommitted(e *entry, n memapi.Bytes) {
	m.mu.Lock()
	if e.inTable {
		e.bytes += n
	}
	m.mu.Unlock()
}

// Decommit calls the plugin's decommit slot.
func (m *Mechanism) Decommit(ctx context.Context, res *memapi.Reservation, r memapi.Range, to memapi.Account) error {
	const op = "VirtualBacking.Decommit"
	if err := m.mutate(op); err != nil {
		return err
	}
	e, err := m.entryOfLive(op, res)
	if err == nil {
		err = m.checkRange(op, res, r)
	}
	if err != nil {
		return m.done(op, err)
	}
	in := cRange{Off: uint64(r.Off), Len: uint64(r.Len)}
	if err := m.slot(op, res.ID(), r.Len, m.lib.vb.Decommit, m.inst, uintptr(e.id), uintptr(unsafe.Pointer(&in))); err != nil {
		return m.done(op, m.unknown(op, res.ID(), e, err))
	}
	m.mu.Lock()
	if e.inTable {
		e.bytes -= min(e.bytes, r.Len)
	}
	m.mu.Unlock()
	return m.done(op, nil)
}

// CommittedBytes calls the plugin's committed_bytes slot.
func (m *Mechanism) CommittedBytes(res *memapi.Reservation) (memapi.Bytes, error) {
	const op = "VirtualBacking.CommittedBytes"
	if err := m.enter(op); err != nil {
		return 0, err
	}
	defer m.leave()
	e, err := m.entryOfLive(op, res)
	if err != nil {
		return 0, err
	}
	var out uint64
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	err = m.slot(op, res.ID(), 0, m.lib.vb.CommittedBytes, m.inst, uintptr(e.id), uintptr(outp))
	back()
	if err != nil {
		return 0, m.unknown(op, res.ID(), e, err)
	}
	return memapi.Bytes(out), nil
}

// ReleaseReservation calls the plugin's release_reservation slot.
func (m *Mechanism) ReleaseReservation(ctx context.Context, res *memapi.Reservation, to memapi.Account) error {
	return m.release("VirtualBacking.ReleaseReservation", res, m.lib.vb.ReleaseReservation)
}

// ---- SharedMapping ------------------------------------------------------

// CreateBacking calls the plugin's create_backing slot with a host-assigned
// id and a deadline. The grant must be present but is not drawn from. A size
// of 0 or over 2^48 bytes fails with ErrInvalidSize before the plugin is
// called.
func (m *Mechanism) CreateBacking(ctx context.Context, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	const op = "SharedMapping.CreateBacking"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	if size == 0 || size > maxSize {
		return nil, m.badSize(op, "size %d is not 1 to 2^48 bytes", size)
	}
	if err := m.mutate(op); err != nil {
		return nil, err
	}
	b, err := m.createBacking(ctx, op, size, grant)
	return b, m.done(op, err)
}

func (m *Mechanism) createBacking(ctx context.Context, op string, size memapi.Bytes, grant memapi.Grant) (*memapi.Backing, error) {
	id := newID()
	out := cBackingOut{ID: id}
	w, err := m.deadline(op, ctx)
	if err != nil {
		return nil, err
	}
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	err = m.slot4(op, 0, size, m.lib.sm.CreateBacking, m.inst, uintptr(w.ns()), uintptr(size), uintptr(outp))
	back()
	if err != nil {
		return nil, err
	}
	if err := m.changedID(op, id, out.ID, memapi.Bytes(out.Size), grant); err != nil {
		return nil, err
	}
	want, _ := memapi.RoundUp(size, m.info.Granularity)
	if out.Size != uint64(want) {
		gerr := m.giveBack(op, m.lib.sm.ReleaseBacking, id, memapi.Bytes(out.Size), grant)
		return nil, joinErr(m.protocol(op, 0, "the plugin returned a backing of %d bytes for a request of %d (want %d)", out.Size, size, want), gerr)
	}
	if w.passed() {
		gerr := m.giveBack(op, m.lib.sm.ReleaseBacking, id, want, grant)
		return nil, joinErr(m.overran(op, w), gerr)
	}
	e := m.adoptNew(kindBacking, id, want)
	return m.issuer.NewBacking(want, e), nil
}

// MapView calls the plugin's map_view slot with a host-assigned id.
func (m *Mechanism) MapView(ctx context.Context, res *memapi.Reservation, rg memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	const op = "SharedMapping.MapView"
	if err := m.mutate(op); err != nil {
		return nil, err
	}
	v, err := m.mapView(op, res, rg, b, access)
	return v, m.done(op, err)
}

func (m *Mechanism) mapView(op string, res *memapi.Reservation, rg memapi.Range, b *memapi.Backing, access memapi.Access) (*memapi.View, error) {
	re, err := m.entryOfLive(op, res)
	if err != nil {
		return nil, err
	}
	be, err := m.entryOfLive(op, b)
	if err != nil {
		return nil, err
	}
	rid, bid := re.id, be.id
	if err := m.checkRange(op, res, rg); err != nil {
		return nil, err
	}
	if rg.Len != b.Size() {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Mechanism: m.info.Mechanism, Handle: b.ID(),
			Detail: fmt.Sprintf("range %v is not the %d bytes of the backing", rg, b.Size())}
	}
	if access != memapi.AccessReadOnly && access != memapi.AccessReadWrite {
		return nil, &memapi.Error{Op: op, Kind: memapi.ErrUnsupported, Mechanism: m.info.Mechanism, Detail: fmt.Sprintf("access %d", access)}
	}
	in := cRange{Off: uint64(rg.Off), Len: uint64(rg.Len)}
	id := newID()
	out := cViewOut{ID: id}
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	err = m.slot(op, res.ID(), rg.Len, m.lib.sm.MapView, m.inst, uintptr(rid), uintptr(unsafe.Pointer(&in)), uintptr(bid), uintptr(access), uintptr(outp))
	back()
	if err != nil {
		if isKind(err, memapi.ErrReleased) {
			m.quarantine(re, 0)
			m.quarantine(be, 0)
			return nil, m.protocol(op, res.ID(), "the plugin does not know reservation %d or backing %d, which the host holds live: both are quarantined (%v)", rid, bid, err)
		}
		return nil, err
	}
	if err := m.changedID(op, id, out.ID, 0, nil); err != nil {
		return nil, err
	}
	if out.Reservation != rid || out.Backing != bid || out.Range != in || out.Access != int32(access) {
		_ = m.giveBack(op, m.lib.sm.UnmapView, id, 0, nil)
		return nil, m.protocol(op, res.ID(), "the plugin mapped %+v, asked for reservation %d, backing %d, range %+v, access %d", out, rid, bid, in, access)
	}
	e := m.adoptNew(kindView, id, 0)
	return m.issuer.NewView(res, rg, b, access, e), nil
}

// UnmapView calls the plugin's unmap_view slot.
func (m *Mechanism) UnmapView(ctx context.Context, v *memapi.View) error {
	return m.release("SharedMapping.UnmapView", v, m.lib.sm.UnmapView)
}

// CopyOnWrite calls the plugin's copy_on_write slot with host-assigned ids
// for the new view and the new backing, and a deadline. v is released and a
// view of a new backing returned; the grant must be present but is not
// drawn from. v no longer exists once the slot succeeded, so a copy that
// returns past its deadline is kept (and reported as an overrun, without
// failing the call).
func (m *Mechanism) CopyOnWrite(ctx context.Context, v *memapi.View, grant memapi.Grant) (*memapi.View, error) {
	const op = "SharedMapping.CopyOnWrite"
	if grant == nil {
		return nil, m.noGrant(op)
	}
	impl, err := m.issuer.BeginRelease(op, v)
	if err != nil {
		return nil, err
	}
	oe := entryOf(impl)
	old := oe.id
	if m.isDisowned(oe) {
		m.issuer.EndRelease(v, false)
		return nil, m.protocol(op, v.ID(), "view %d is quarantined: the plugin disowned it", old)
	}
	if err := m.mutate(op); err != nil {
		m.issuer.EndRelease(v, false)
		return nil, err
	}
	res := v.Reservation()
	rid, _ := m.issuer.Impl(op, res) // live: v keeps it
	vid, bid := newID(), newID()
	out := cViewOut{ID: vid, Backing: bid}
	w, err := m.deadline(op, ctx)
	if err != nil {
		m.issuer.EndRelease(v, false)
		return nil, m.done(op, err)
	}
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	err = m.slot4(op, v.ID(), v.Range().Len, m.lib.sm.CopyOnWrite, m.inst, uintptr(w.ns()), uintptr(old), uintptr(outp))
	back()
	if err != nil {
		err = m.unknown(op, v.ID(), oe, err)
		m.issuer.EndRelease(v, false)
		return nil, m.done(op, err)
	}
	// The plugin replaced v: its id is dead.
	m.forget(oe)
	m.issuer.EndRelease(v, true)
	rg := v.Range()
	if out.ID != vid || out.Backing != bid {
		for _, id := range []uint64{out.ID, out.Backing} {
			if e := m.liveEntry(id); e != nil {
				m.quarantine(e, 0) // the id names two objects of the plugin now
			}
		}
		cerr := m.quarantineCharged(grant, rg.Len)
		return nil, m.done(op, joinErr(m.protocol(op, v.ID(), "the plugin changed the assigned ids (view %d to %d, backing %d to %d): nothing released, %d bytes quarantined", vid, out.ID, bid, out.Backing, rg.Len), cerr))
	}
	ve := m.adoptNew(kindView, vid, 0)
	be := m.adoptNew(kindBacking, bid, rg.Len)
	nb := m.issuer.NewBacking(rg.Len, be)
	nv := m.issuer.NewView(res, rg, nb, memapi.AccessReadWrite, ve)
	if out.Reservation != entryOf(rid).id || out.Range != (cRange{Off: uint64(rg.Off), Len: uint64(rg.Len)}) || out.Access != int32(memapi.AccessReadWrite) {
		return nv, m.done(op, m.protocol(op, v.ID(), "the plugin's copy %+v is not a read-write view of range %v of reservation %v", out, rg, rid))
	}
	if w.passed() {
		_ = m.overran(op, w)
	}
	return nv, m.done(op, nil)
}

// ViewCount calls the plugin's view_count slot.
func (m *Mechanism) ViewCount(b *memapi.Backing) (int, error) {
	const op = "SharedMapping.ViewCount"
	if err := m.enter(op); err != nil {
		return 0, err
	}
	defer m.leave()
	e, err := m.entryOfLive(op, b)
	if err != nil {
		return 0, err
	}
	var out int64
	outp, back := m.guarded(unsafe.Pointer(&out), unsafe.Sizeof(out))
	err = m.slot(op, b.ID(), 0, m.lib.sm.ViewCount, m.inst, uintptr(e.id), uintptr(outp))
	back()
	if err != nil {
		return 0, m.unknown(op, b.ID(), e, err)
	}
	return int(out), nil
}

// ReleaseBacking calls the plugin's release_backing slot.
func (m *Mechanism) ReleaseBacking(ctx context.Context, b *memapi.Backing, to memapi.Account) error {
	return m.release("SharedMapping.ReleaseBacking", b, m.lib.sm.ReleaseBacking)
}
