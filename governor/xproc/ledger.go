package xproc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultSlots is the slot count of a ledger created without one.
const DefaultSlots = 64

// CreateOptions describe a ledger file made by Open when none exists.
type CreateOptions struct {
	Capacity uint64 // the shared capacity, in bytes (at least 1)
	Slots    int    // processes it can seat; 0 means DefaultSlots
	// Mode is 0600 (the creating user's processes only, the default) or
	// 0660 with Group: only processes that can open the file take part.
	Mode  os.FileMode
	Group int // the group of a 0660 file (a gid); ignored for 0600
}

// Options configure a process's membership of a ledger.
type Options struct {
	Create *CreateOptions // nil: the ledger must exist
	// Poll is the period of the liveness check and of the settle of this
	// process's figures; 0 means 100 ms. A dead process's slot is
	// reclaimed within Poll of its death (the pidfd wakes the watcher at
	// once; the period bounds a slot joined since the last check).
	Poll    time.Duration
	OnEvent func(Event) // called from the watcher, never with a lock held
}

// Ledger is one process's membership of a shared ledger file: the mapping,
// its slot, and the watcher that reclaims the slots of dead processes.
// All methods are safe for concurrent use.
type Ledger struct {
	path    string
	f       *os.File
	mem     []byte
	slots   int
	slot    int // this process's
	pid     int
	start   uint64
	poll    time.Duration
	onEvent func(Event)

	mu     sync.Mutex // orders this process's users of the file lock
	closed bool
	auth   atomic.Pointer[Authority] // bound by Bind, or nil

	joinRev    uint64  // the limits' revision when this process joined
	joinEvents []Event // reclaims made while joining, emitted by the watcher

	stop int // eventfd: Close wakes the watcher
	done chan struct{}
}

// Open maps the ledger at path (creating it from o.Create when it does not
// exist), checks it, takes a free slot for this process and starts the
// watcher. A short, foreign, other-version or inconsistent file is a
// *LedgerError (ErrTruncated, ErrForeign, ErrVersion, ErrCorrupt); a ledger
// whose slots are all held by live processes is ErrFull.
func Open(path string, o Options) (*Ledger, error) {
	const op = "xproc.Open"
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) && o.Create != nil {
		f, err = create(path, *o.Create)
	}
	if err != nil {
		var le *LedgerError
		if errors.As(err, &le) {
			return nil, err
		}
		return nil, &LedgerError{Op: op, Path: path, Err: err}
	}
	l := &Ledger{path: path, f: f, pid: os.Getpid(), poll: o.Poll, onEvent: o.OnEvent, stop: -1}
	if l.poll <= 0 {
		l.poll = 100 * time.Millisecond
	}
	l.start = startTime(l.pid)
	if err := l.mapAndJoin(); err != nil {
		if l.mem != nil {
			_ = unix.Munmap(l.mem)
		}
		f.Close()
		return nil, err
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		_ = l.leave()
		return nil, &LedgerError{Op: op, Path: path, Err: err, Detail: "eventfd"}
	}
	l.stop = fd
	l.done = make(chan struct{})
	go l.watch()
	return l, nil
}

// create makes the ledger file: written whole under a temporary name, then
// linked to path, so no process ever opens a half-written ledger. Whoever
// loses a race to create it opens the winner's.
func create(path string, c CreateOptions) (*os.File, error) {
	const op = "xproc.Create"
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Mode == 0 {
		c.Mode = 0o600
	}
	if c.Slots < 1 || c.Slots > MaxSlots || c.Capacity == 0 || c.Capacity > maxBytes || (c.Mode != 0o600 && c.Mode != 0o660) {
		return nil, ledgerErr(op, path, ErrCorrupt, "bad create options: %d slots, capacity %d, mode %v", c.Slots, c.Capacity, c.Mode)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, &LedgerError{Op: op, Path: path, Err: err}
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	b := make([]byte, fileSize(c.Slots))
	put := func(i int, v uint64) {
		b[i*8], b[i*8+1], b[i*8+2], b[i*8+3], b[i*8+4], b[i*8+5], b[i*8+6], b[i*8+7] = le8(v)
	}
	put(hMagic, magic)
	put(hVersion, Version)
	put(hSlots, uint64(c.Slots))
	put(hCapacity, c.Capacity)
	put(hRevision, 1)
	if _, err := tmp.Write(b); err != nil {
		return nil, &LedgerError{Op: op, Path: path, Err: err}
	}
	if err := tmp.Chmod(c.Mode); err != nil {
		return nil, &LedgerError{Op: op, Path: path, Err: err}
	}
	if c.Mode == 0o660 {
		if err := tmp.Chown(-1, c.Group); err != nil {
			return nil, &LedgerError{Op: op, Path: path, Err: err, Detail: "group " + strconv.Itoa(c.Group)}
		}
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, &LedgerError{Op: op, Path: path, Err: err}
	}
	return os.OpenFile(path, os.O_RDWR, 0)
}

func le8(v uint64) (a, b, c, d, e, f, g, h byte) {
	return byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24), byte(v >> 32), byte(v >> 40), byte(v >> 48), byte(v >> 56)
}

// readImage reads the whole file (bounded by the largest valid ledger).
func readImage(f *os.File) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, int64(fileSize(MaxSlots))+1), int64(fileSize(MaxSlots))+1))
	return b, err
}

// mapAndJoin checks the file under the lock, maps it and takes a slot.
func (l *Ledger) mapAndJoin() error {
	const op = "xproc.Open"
	if err := flock(l.f, unix.LOCK_EX); err != nil {
		return &LedgerError{Op: op, Path: l.path, Err: err, Detail: "flock"}
	}
	defer flock(l.f, unix.LOCK_UN)
	b, err := readImage(l.f)
	if err != nil {
		return &LedgerError{Op: op, Path: l.path, Err: err}
	}
	h, _, err := Parse(b)
	if err != nil {
		e := err.(*LedgerError)
		e.Op, e.Path = op, l.path
		return e
	}
	l.slots = h.Slots
	mem, err := unix.Mmap(int(l.f.Fd()), 0, fileSize(h.Slots), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return &LedgerError{Op: op, Path: l.path, Err: err, Detail: "mmap"}
	}
	l.mem = mem
	l.repairLocked()
	l.slot = -1
	events := l.scanLocked()
	for i := 0; i < l.slots; i++ {
		if l.load(l.sw(i, sPID)) == 0 {
			l.slot = i
			break
		}
	}
	if l.slot < 0 {
		return ledgerErr(op, l.path, ErrFull, "%d slots, all held by live processes", l.slots)
	}
	l.store(l.sw(l.slot, sStart), l.start)
	l.store(l.sw(l.slot, sPID), uint64(l.pid))
	l.joinRev = l.load(l.hw(hRevision))
	l.joinEvents = events
	return nil
}

// flock takes or drops the file lock. It is a robust lock: the kernel drops
// it when its holder dies, however it dies.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

// hw and sw address a header word and a word of slot i.
func (l *Ledger) hw(i int) *uint64 { return (*uint64)(unsafe.Pointer(&l.mem[i*8])) }
func (l *Ledger) sw(slot, i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&l.mem[headerSize+slot*slotSize+i*8]))
}
func (l *Ledger) load(p *uint64) uint64     { return atomic.LoadUint64(p) }
func (l *Ledger) store(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
func (l *Ledger) add(p *uint64, d uint64)   { atomic.AddUint64(p, d) }

// lock takes the process's mutex and the file lock; unlock drops both.
// Writes that move several words run between begin and end, which mark the
// header dirty: a lock holder that finds it dirty knows a writer died in
// the middle and recomputes the totals from the slots (repairLocked).
func (l *Ledger) lock() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return &LedgerError{Path: l.path, Err: ErrClosed}
	}
	if err := flock(l.f, unix.LOCK_EX); err != nil {
		l.mu.Unlock()
		return &LedgerError{Path: l.path, Err: err, Detail: "flock"}
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(l.f.Fd()), &st); err != nil || st.Size != int64(len(l.mem)) {
		l.unlock()
		return ledgerErr("", l.path, ErrTruncated, "the file is %d bytes, mapped %d", st.Size, len(l.mem))
	}
	l.repairLocked()
	return nil
}

func (l *Ledger) unlock() {
	_ = flock(l.f, unix.LOCK_UN)
	l.mu.Unlock()
}

func (l *Ledger) begin() { l.store(l.hw(hDirty), uint64(l.pid)) }
func (l *Ledger) end()   { l.store(l.hw(hDirty), 0) }

// repairLocked recomputes the totals from the slots when a writer died
// between begin and end. The slots are the truth: each slot word is one
// store, and a dead writer's own slot is reclaimed next.
func (l *Ledger) repairLocked() {
	if l.load(l.hw(hDirty)) == 0 {
		return
	}
	var sum [4]uint64
	for i := 0; i < l.slots; i++ {
		for k, w := range []int{sClaim, sReserved, sCharged, sPending} {
			sum[k] += l.load(l.sw(i, w))
		}
	}
	for k, w := range []int{hClaimed, hReserved, hCharged, hPending} {
		l.store(l.hw(w), sum[k])
	}
	l.add(l.hw(hRepairs), 1)
	l.end()
}

// scanLocked reclaims the slots of processes that are gone and returns the
// events to emit.
func (l *Ledger) scanLocked() []Event {
	var ev []Event
	for i := 0; i < l.slots; i++ {
		pid := int(l.load(l.sw(i, sPID)))
		if pid == 0 || i == l.slot {
			continue
		}
		if !alive(pid, l.load(l.sw(i, sStart))) {
			ev = append(ev, l.reclaimLocked(i))
		}
	}
	return ev
}

// reclaimLocked frees slot i of a dead process: its claim returns to the
// shared capacity. The kernel released the process's memory when it died
// (its mappings, its memfds without other references, its CUDA context and
// every allocation in it), so the bytes the slot counted are free on the
// device: counting them free is what the hardware says.
func (l *Ledger) reclaimLocked(i int) Event {
	e := l.freeSlotLocked(i)
	l.add(l.hw(hReclaims), 1)
	return e
}

// freeSlotLocked empties slot i and takes its figures out of the totals.
func (l *Ledger) freeSlotLocked(i int) Event {
	e := Event{Kind: EventReclaimed, Slot: i, PID: int(l.load(l.sw(i, sPID))), Time: time.Now(),
		Claim: l.load(l.sw(i, sClaim)), Reserved: l.load(l.sw(i, sReserved)),
		Charged: l.load(l.sw(i, sCharged)), Pending: l.load(l.sw(i, sPending))}
	l.begin()
	l.add(l.hw(hClaimed), -e.Claim)
	l.add(l.hw(hReserved), -e.Reserved)
	l.add(l.hw(hCharged), -e.Charged)
	l.add(l.hw(hPending), -e.Pending)
	// The figures before the claim, the PID last: a writer that dies
	// here leaves a slot that still uses no more than it claims, whose
	// dead owner the next lock holder reclaims again.
	for _, w := range []int{sReserved, sCharged, sPending, sClaim, sSeq, sUnused, sStart, sPID} {
		l.store(l.sw(i, w), 0)
	}
	l.end()
	return e
}

func (l *Ledger) emitAll(ev []Event) {
	if l.onEvent == nil {
		return
	}
	for _, e := range ev {
		l.onEvent(e)
	}
}

// Slot returns this process's slot index.
func (l *Ledger) Slot() int { return l.slot }

// Path returns the ledger file's path.
func (l *Ledger) Path() string { return l.path }

// State reads the header and every slot under the lock.
func (l *Ledger) State() (Header, []Slot, error) {
	if err := l.lock(); err != nil {
		return Header{}, nil, err
	}
	defer l.unlock()
	b := make([]byte, len(l.mem))
	for i := 0; i < len(b)/8; i++ {
		v := atomic.LoadUint64((*uint64)(unsafe.Pointer(&l.mem[i*8])))
		b[i*8], b[i*8+1], b[i*8+2], b[i*8+3], b[i*8+4], b[i*8+5], b[i*8+6], b[i*8+7] = le8(v)
	}
	return Parse(b)
}

// Close stops the watcher and gives the slot back. It fails with ErrInUse,
// changing nothing, while the bound authority holds bytes: they are this
// process's until it frees them (or exits, and a survivor reclaims the
// slot). On a file truncated under it, it shuts down all the same and
// returns ErrTruncated.
func (l *Ledger) Close() error {
	var broken error
	if a := l.auth.Load(); a != nil {
		if err := a.release(); errors.Is(err, ErrInUse) {
			return err
		} else if err != nil {
			broken = err // a file made unusable under us: shut down all the same
		}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(l.stop, one[:])
	<-l.done
	unix.Close(l.stop)
	if err := l.leave(); broken == nil {
		broken = err
	}
	return broken
}

// leave frees the slot, unmaps and closes the file.
func (l *Ledger) leave() error {
	err := flock(l.f, unix.LOCK_EX)
	if err == nil {
		var st unix.Stat_t
		if ferr := unix.Fstat(int(l.f.Fd()), &st); ferr != nil || st.Size != int64(len(l.mem)) {
			// Truncated under us: touching the mapping would fault.
			err = ledgerErr("", l.path, ErrTruncated, "the file is %d bytes, mapped %d", st.Size, len(l.mem))
		} else if l.slot >= 0 && int(l.load(l.sw(l.slot, sPID))) == l.pid {
			l.freeSlotLocked(l.slot)
		}
		_ = flock(l.f, unix.LOCK_UN)
	}
	_ = unix.Munmap(l.mem)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return &LedgerError{Op: "xproc.Close", Path: l.path, Err: err}
	}
	return nil
}

// Inspect reads a ledger file without joining it (the operator's view,
// memctl): under a shared lock, checked by Parse.
func Inspect(path string) (Header, []Slot, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, nil, &LedgerError{Op: "xproc.Inspect", Path: path, Err: err}
	}
	defer f.Close()
	if err := flock(f, unix.LOCK_SH); err != nil {
		return Header{}, nil, &LedgerError{Op: "xproc.Inspect", Path: path, Err: err, Detail: "flock"}
	}
	defer flock(f, unix.LOCK_UN)
	b, err := readImage(f)
	if err != nil {
		return Header{}, nil, &LedgerError{Op: "xproc.Inspect", Path: path, Err: err}
	}
	h, s, err := Parse(b)
	if err != nil {
		e := err.(*LedgerError)
		e.Op, e.Path = "xproc.Inspect", path
		return h, s, e
	}
	return h, s, nil
}

// String formats a slot for logs and memctl.
func (s Slot) String() string {
	return fmt.Sprintf("slot %d pid %d: claim %d reserved %d charged %d pending %d", s.Index, s.PID, s.Claim, s.Reserved, s.Charged, s.Pending)
}
