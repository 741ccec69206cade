package xproc

import (
	"context"
	"encoding/binary"
	"errors"
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

// defaultSlots is the slot count of a ledger created without one.
const defaultSlots = 64

// CreateOptions describe a ledger file made by Open when none exists.
type CreateOptions struct {
	Capacity uint64 // the shared capacity, in bytes (at least 1)
	Slots    int    // processes it can seat; 0 means 64
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
	Poll time.Duration
	// LockTimeout bounds every wait of this member for the ledger's lock
	// (and for the calls of its own process ahead of it): the calls that
	// take no context (Open, Close, State, and the mechanisms' accounts of
	// the memory they keep for themselves) and each round of the watcher
	// and the settler wait that long, and OpenContext, CloseContext and
	// reservations until their context ends or that long, whichever comes
	// first, so a reservation with context.Background() behind a stopped
	// lock holder fails with an error naming it. 0 means DefaultLockTimeout.
	LockTimeout time.Duration
	// onEvent, when set, is told of every reclaim and limits change
	// (tests wait for them); it is called from the watcher, never with a
	// lock held.
	onEvent func(event)
}

// Ledger is one process's membership of a shared ledger file: the mapping,
// its slot, the watcher that reclaims the slots of dead processes and,
// once an authority is bound, the settler that publishes its figures.
// All methods are safe for concurrent use.
type Ledger struct {
	path        string
	f           *os.File
	fd          int
	mem         []byte
	slots       int
	slot        int // this process's
	pid         int
	start       uint64
	poll        time.Duration
	lockTimeout time.Duration
	onEvent     func(event)

	// sem orders this process's users of the file lock: a mutex whose
	// waiters give up when their context ends.
	sem     chan struct{}
	closed  bool                      // under sem
	auth    atomic.Pointer[authority] // bound by Bind, or nil
	binding sync.Mutex                // orders Binds

	joinRev    uint64  // the limits' revision when this process joined
	joinEvents []event // reclaims made while joining, emitted by the watcher

	ctx     context.Context // ends at Close: the watcher's and the settler's waits
	cancel  context.CancelFunc
	stop    int // eventfd: Close wakes the watcher
	done    chan struct{}
	settled chan struct{} // the settler's end (nil until Bind starts it)

	// watching, when set, is called by the watcher with each slot and
	// owner it opened a pidfd on (tests only: they wait for it rather than
	// sleep; it must not block).
	watching atomic.Pointer[func(slot, pid int)]
}

// Open is OpenContext with a context bounded by o.LockTimeout.
func Open(path string, o Options) (*Ledger, error) {
	ctx, cancel := context.WithTimeout(context.Background(), lockTimeoutOf(o.LockTimeout))
	defer cancel()
	return OpenContext(ctx, path, o)
}

func lockTimeoutOf(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultLockTimeout
	}
	return d
}

// OpenContext maps the ledger at path (creating it from o.Create when it
// does not exist), checks it, takes a free slot for this process and
// starts the watcher. It refuses, with an error that says why, an unsafe
// file (a symlink, not a regular file, a mode beyond 0660, a stranger's
// file: see file.go), a short, foreign, other-version or inconsistent
// file, a ledger whose slots are all held by live processes, and a process
// of another PID namespace than the members'; a lock not taken before ctx
// ends (or the lock timeout passes) is an error naming its holders and
// their state.
func OpenContext(ctx context.Context, path string, o Options) (*Ledger, error) {
	const op = "xproc.Open"
	group := anyGroup
	if o.Create != nil && o.Create.Mode == 0o660 {
		group = o.Create.Group
	}
	f, err := openFile(op, path, unix.O_RDWR, group)
	if errors.Is(err, os.ErrNotExist) && o.Create != nil {
		f, err = create(path, *o.Create)
	}
	if err != nil {
		return nil, err
	}
	l := &Ledger{path: path, f: f, fd: int(f.Fd()), pid: os.Getpid(), poll: o.Poll, lockTimeout: lockTimeoutOf(o.LockTimeout),
		onEvent: o.onEvent, stop: -1, sem: make(chan struct{}, 1)}
	if l.poll <= 0 {
		l.poll = 100 * time.Millisecond
	}
	l.start = startTime(l.pid)
	if err := l.mapAndJoin(ctx); err != nil {
		if l.mem != nil {
			_ = unix.Munmap(l.mem)
		}
		f.Close()
		return nil, err
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		l.ctx, l.cancel = context.WithCancel(context.Background())
		_ = l.CloseContext(ctx)
		return nil, &ledgerError{Op: op, Path: path, Err: err, Detail: "eventfd"}
	}
	l.stop = fd
	l.ctx, l.cancel = context.WithCancel(context.Background())
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
		c.Slots = defaultSlots
	}
	if c.Mode == 0 {
		c.Mode = 0o600
	}
	if c.Slots < 1 || c.Slots > maxSlots || c.Capacity == 0 || c.Capacity > maxBytes || (c.Mode != 0o600 && c.Mode != 0o660) {
		return nil, ledgerErr(op, path, errCorrupt, "bad create options: %d slots, capacity %d, mode %v", c.Slots, c.Capacity, c.Mode)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, &ledgerError{Op: op, Path: path, Err: err}
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	b := make([]byte, fileSize(c.Slots))
	put := func(i int, v uint64) {
		b[i*8], b[i*8+1], b[i*8+2], b[i*8+3], b[i*8+4], b[i*8+5], b[i*8+6], b[i*8+7] = le8(v)
	}
	put(hMagic, magic)
	put(hVersion, version)
	put(hSlots, uint64(c.Slots))
	put(hCapacity, c.Capacity)
	put(hRevision, 1)
	put(hPIDNS, pidNamespace())
	put(hSum, headerSum(b))
	if _, err := tmp.Write(b); err != nil {
		return nil, &ledgerError{Op: op, Path: path, Err: err}
	}
	if err := tmp.Chmod(c.Mode); err != nil {
		return nil, &ledgerError{Op: op, Path: path, Err: err}
	}
	if c.Mode == 0o660 {
		if err := tmp.Chown(-1, c.Group); err != nil {
			return nil, &ledgerError{Op: op, Path: path, Err: err, Detail: "group " + strconv.Itoa(c.Group)}
		}
	}
	// Renamed into place without replacing: the ledger appears whole, and
	// with one name (a hard link would leave two until the temporary name
	// is removed, which a process opening it then would refuse).
	err = unix.Renameat2(unix.AT_FDCWD, tmp.Name(), unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
	if err != nil && err != unix.EEXIST {
		return nil, &ledgerError{Op: op, Path: path, Err: &os.LinkError{Op: "rename", Old: tmp.Name(), New: path, Err: err}}
	}
	group := anyGroup
	if c.Mode == 0o660 {
		group = c.Group
	}
	return openFile("xproc.Open", path, unix.O_RDWR, group)
}

func le8(v uint64) (a, b, c, d, e, f, g, h byte) {
	return byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24), byte(v >> 32), byte(v >> 40), byte(v >> 48), byte(v >> 56)
}

// readImage reads the whole file (bounded by the largest valid ledger).
func readImage(f *os.File) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, int64(fileSize(maxSlots))+1), int64(fileSize(maxSlots))+1))
	return b, err
}

// mapAndJoin checks the file under the lock, maps it and takes a slot.
func (l *Ledger) mapAndJoin(ctx context.Context) error {
	const op = "xproc.Open"
	gone := goneInImage(l.f) // read outside the lock: reclaimed under it when the slots still name them
	if err := lockFile(ctx, op, l.path, l.fd, unix.LOCK_EX, l.lockTimeout); err != nil {
		return err
	}
	defer unlockFile(l.fd)
	b, err := readImage(l.f)
	if err != nil {
		return &ledgerError{Op: op, Path: l.path, Err: err}
	}
	h, _, err := parse(b)
	if err != nil {
		e := err.(*ledgerError)
		e.Op, e.Path = op, l.path
		return e
	}
	if ns := pidNamespace(); h.PIDNamespace != ns {
		return ledgerErr(op, l.path, errNamespace, "the ledger's members are in PID namespace %d, this process in %d: the liveness of a member is its PID in /proc, which names other processes here", h.PIDNamespace, ns)
	}
	l.slots = h.Slots
	mem, err := unix.Mmap(l.fd, 0, fileSize(h.Slots), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return &ledgerError{Op: op, Path: l.path, Err: err, Detail: "mmap"}
	}
	l.mem = mem
	l.beginLocked()
	defer l.sealLocked()
	l.slot = -1
	events := l.reclaimGoneLocked(gone)
	for i := 0; i < l.slots; i++ {
		if l.load(l.sw(i, sPID)) == 0 {
			l.slot = i
			break
		}
	}
	if l.slot < 0 {
		return ledgerErr(op, l.path, errFull, "%d slots, all held by live processes", l.slots)
	}
	l.store(l.sw(l.slot, sStart), l.start)
	l.store(l.sw(l.slot, sPID), uint64(l.pid))
	l.joinRev = l.load(l.hw(hRevision))
	l.joinEvents = events
	return nil
}

// hw and sw address a header word and a word of slot i.
func (l *Ledger) hw(i int) *uint64 { return (*uint64)(unsafe.Pointer(&l.mem[i*8])) }
func (l *Ledger) sw(slot, i int) *uint64 {
	return (*uint64)(unsafe.Pointer(&l.mem[headerSize+slot*slotSize+i*8]))
}
func (l *Ledger) load(p *uint64) uint64     { return atomic.LoadUint64(p) }
func (l *Ledger) store(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
func (l *Ledger) add(p *uint64, d uint64)   { atomic.AddUint64(p, d) }

// lock takes the process's semaphore and the file lock before ctx ends
// and within the lock timeout, checks the file (its size, the header's
// checksum and the slots') and marks the header
// dirty; unlock seals it (the checksum, then the dirty word cleared) and
// drops both. A lock holder that finds the header dirty knows the last
// holder died holding the lock, and recomputes the totals from the slots
// (repairLocked). op names the caller in a *lockError.
func (l *Ledger) lock(ctx context.Context, op string) error {
	ctx, cancel := context.WithTimeout(ctx, l.lockTimeout)
	defer cancel()
	start := time.Now()
	select {
	case l.sem <- struct{}{}:
	default:
		select {
		case l.sem <- struct{}{}:
		case <-ctx.Done():
			return lockTimeout(ctx, op, l.path, l.fd, start)
		}
	}
	if l.closed {
		<-l.sem
		return &ledgerError{Op: op, Path: l.path, Err: errClosed}
	}
	if err := lockFile(ctx, op, l.path, l.fd, unix.LOCK_EX, l.lockTimeout); err != nil {
		<-l.sem
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(l.fd, &st); err != nil || st.Size != int64(len(l.mem)) {
		unlockFile(l.fd)
		<-l.sem
		return ledgerErr(op, l.path, errTruncated, "the file is %d bytes, mapped %d", st.Size, len(l.mem))
	}
	if d := l.load(l.hw(hDirty)); !validDirty(d) || d == 0 && l.load(l.hw(hSum)) != l.sumLocked() {
		unlockFile(l.fd)
		<-l.sem
		return ledgerErr(op, l.path, errCorrupt, "the header's checksum or dirty word is wrong: a bit flipped, or a non-member wrote it")
	}
	if l.load(l.hw(hDirty)) == 0 {
		if i := l.badSlotLocked(); i >= 0 {
			unlockFile(l.fd)
			<-l.sem
			return ledgerErr(op, l.path, errCorrupt, "slot %d's checksum is wrong: a bit flipped, or a non-member wrote it", i)
		}
	}
	l.beginLocked()
	return nil
}

func (l *Ledger) unlock() {
	l.sealLocked()
	unlockFile(l.fd)
	<-l.sem
}

// beginLocked repairs a header its last holder left dirty and marks it
// dirty with this process's mark.
func (l *Ledger) beginLocked() {
	if l.load(l.hw(hDirty)) != 0 {
		l.repairLocked()
	}
	l.store(l.hw(hDirty), dirtyMark(l.pid))
	// The operator's want ends once the claims fit the capacity again.
	if l.load(l.hw(hWant)) != 0 && l.load(l.hw(hClaimed)) <= l.load(l.hw(hCapacity)) {
		l.store(l.hw(hWant), 0)
		l.store(l.hw(hWantLeft), 0)
		l.store(l.hw(hWantOut), 0)
	}
}

// sealLocked writes the slots' checksums and the header's, then clears
// the dirty word.
func (l *Ledger) sealLocked() {
	var w [slotWords]uint64
	for i := 0; i < l.slots; i++ {
		l.slotWords(i, &w)
		if sum := occupiedSum(i, &w); sum != w[sSum] {
			l.store(l.sw(i, sSum), sum)
		}
	}
	l.store(l.hw(hSum), l.sumLocked())
	l.store(l.hw(hDirty), 0)
}

// slotWords loads slot i's words into w.
func (l *Ledger) slotWords(i int, w *[slotWords]uint64) {
	for k := range w {
		w[k] = l.load(l.sw(i, k))
	}
}

// badSlotLocked returns the first slot whose checksum is wrong, or -1.
func (l *Ledger) badSlotLocked() int {
	var w [slotWords]uint64
	for i := 0; i < l.slots; i++ {
		l.slotWords(i, &w)
		if !slotOK(i, &w) {
			return i
		}
	}
	return -1
}

// sumLocked is the checksum of the mapped header.
func (l *Ledger) sumLocked() uint64 {
	var b [headerSize]byte
	for i := 0; i < hSum; i++ {
		binary.LittleEndian.PutUint64(b[i*8:], l.load(l.hw(i)))
	}
	return headerSum(b[:])
}

// repairLocked recomputes the totals from the slots after a lock holder
// died with the header dirty. The slots are the truth: each slot word is
// one store, a dead writer's own slot is reclaimed next, and a want whose
// parts no longer add up starts again whole.
func (l *Ledger) repairLocked() {
	var sum [5]uint64
	tot := []int{hClaimed, hReserved, hCharged, hPending, hPrivate}
	for i := 0; i < l.slots; i++ {
		if l.load(l.sw(i, sPID)) == 0 {
			// A free slot is all zeros: a joiner that died between its
			// stores left a start time.
			for w := 0; w < slotWords; w++ {
				l.store(l.sw(i, w), 0)
			}
			continue
		}
		for k, w := range []int{sClaim, sReserved, sCharged, sPending, sPrivate} {
			sum[k] += l.load(l.sw(i, w))
		}
		if l.load(l.sw(i, sWantLeft))+l.load(l.sw(i, sWantOut)) > l.load(l.sw(i, sWant)) {
			l.store(l.sw(i, sWantLeft), l.load(l.sw(i, sWant)))
			l.store(l.sw(i, sWantOut), 0)
		}
	}
	for k, w := range tot {
		l.store(l.hw(w), sum[k])
	}
	if l.load(l.hw(hWantLeft))+l.load(l.hw(hWantOut)) > l.load(l.hw(hWant)) {
		l.store(l.hw(hWantLeft), l.load(l.hw(hWant)))
		l.store(l.hw(hWantOut), 0)
	}
	l.add(l.hw(hRepairs), 1)
}

// slotOwner is the owner of a slot as read without the lock: the lock holder
// acts on it only while the slot still names it (holdsLocked).
type slotOwner struct {
	slot  int
	pid   int
	start uint64
}

// holdsLocked reports whether slot m.slot still names m's owner.
func (l *Ledger) holdsLocked(m slotOwner) bool {
	return int(l.load(l.sw(m.slot, sPID))) == m.pid && l.load(l.sw(m.slot, sStart)) == m.start
}

// goneMembers returns the other slots whose owners are gone, read without
// the lock: liveness is a /proc read per slot, a syscall that never runs
// under the lock (dozens of members reading it there would keep each
// other out for most of a second). The lock holder reclaims them with
// reclaimGoneLocked, which confirms each slot still names its owner.
func (l *Ledger) goneMembers() []slotOwner {
	var gone []slotOwner
	for i := 0; i < l.slots; i++ {
		pid := int(l.load(l.sw(i, sPID)))
		if pid == 0 || i == l.slot {
			continue
		}
		if start := l.load(l.sw(i, sStart)); !alive(pid, start) {
			gone = append(gone, slotOwner{slot: i, pid: pid, start: start})
		}
	}
	return gone
}

// goneInImage is goneMembers for a process that has not mapped the file
// yet (Open): the slots of gone owners in an image read without the lock.
// A torn or foreign image gives none (the lock holder checks the file).
func goneInImage(f *os.File) []slotOwner {
	b, err := readImage(f)
	if err != nil || len(b) < headerSize || word(b, hMagic) != magic || word(b, hVersion) != version {
		return nil
	}
	n := word(b, hSlots)
	if n == 0 || n > maxSlots || len(b) < fileSize(int(n)) {
		return nil
	}
	var gone []slotOwner
	for i := 0; i < int(n); i++ {
		s := b[headerSize+i*slotSize:]
		pid, start := word(s, sPID), word(s, sStart)
		if pid != 0 && pid <= 1<<22 && !alive(int(pid), start) {
			gone = append(gone, slotOwner{slot: i, pid: int(pid), start: start})
		}
	}
	return gone
}

// reclaimGoneLocked reclaims the slots of gone that still name their
// owners, and returns the events to emit.
func (l *Ledger) reclaimGoneLocked(gone []slotOwner) []event {
	var ev []event
	for _, m := range gone {
		if m.slot < l.slots && l.holdsLocked(m) {
			ev = append(ev, l.reclaimLocked(m.slot))
		}
	}
	return ev
}

// freeHint is the shared capacity not claimed, read without the lock: it
// decides whether a claim reads liveness first, never what it claims.
func (l *Ledger) freeHint() uint64 {
	c, u := l.load(l.hw(hCapacity)), l.load(l.hw(hClaimed))
	if u >= c {
		return 0
	}
	return c - u
}

// reclaimLocked frees slot i of a dead process: its claim returns to the
// shared capacity and its want is withdrawn. The kernel released the
// process's memory when it died (its mappings, its memfds without other
// references, its CUDA context and every allocation in it, its
// mechanisms' pools), so the bytes the slot counted are free on the
// device: counting them free is what the hardware says.
func (l *Ledger) reclaimLocked(i int) event {
	e := l.freeSlotLocked(i)
	l.add(l.hw(hReclaims), 1)
	return e
}

// freeSlotLocked empties slot i and takes its figures out of the totals.
func (l *Ledger) freeSlotLocked(i int) event {
	e := event{Kind: eventReclaimed, Slot: i, PID: int(l.load(l.sw(i, sPID))), Time: time.Now(),
		Claim: l.load(l.sw(i, sClaim)), Reserved: l.load(l.sw(i, sReserved)),
		Charged: l.load(l.sw(i, sCharged)), Pending: l.load(l.sw(i, sPending)),
		Private: l.load(l.sw(i, sPrivate)), Want: l.load(l.sw(i, sWant))}
	l.add(l.hw(hClaimed), -e.Claim)
	l.add(l.hw(hReserved), -e.Reserved)
	l.add(l.hw(hCharged), -e.Charged)
	l.add(l.hw(hPending), -e.Pending)
	l.add(l.hw(hPrivate), -e.Private)
	for w := slotWords - 1; w >= 0; w-- { // the PID last
		l.store(l.sw(i, w), 0)
	}
	return e
}

func (l *Ledger) emitAll(ev []event) {
	if l.onEvent == nil {
		return
	}
	for _, e := range ev {
		l.onEvent(e)
	}
}

// State reads the header and every slot under the lock (waiting for it at
// most the ledger's LockTimeout).
func (l *Ledger) State() (Header, []Slot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.lockTimeout)
	defer cancel()
	if err := l.lock(ctx, "xproc.State"); err != nil {
		return Header{}, nil, err
	}
	b := make([]byte, len(l.mem))
	for i := 0; i < len(b)/8; i++ {
		binary.LittleEndian.PutUint64(b[i*8:], atomic.LoadUint64((*uint64)(unsafe.Pointer(&l.mem[i*8]))))
	}
	l.unlock()
	// As sealed.
	binary.LittleEndian.PutUint64(b[hDirty*8:], 0)
	binary.LittleEndian.PutUint64(b[hSum*8:], headerSum(b))
	return parse(b)
}

// Close is CloseContext with a context bounded by the ledger's LockTimeout.
func (l *Ledger) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.lockTimeout)
	defer cancel()
	return l.CloseContext(ctx)
}

// CloseContext gives the slot back and stops the watcher and the settler.
// It fails, changing nothing, while the bound authority holds bytes
// (private ones included): they are this process's until it frees them (or
// exits, and a survivor reclaims the slot); and, changing nothing, when the
// lock is not taken before ctx ends or the lock timeout passes (call it
// again). On a file truncated or
// corrupted under it, it shuts down all the same and returns that error.
func (l *Ledger) CloseContext(ctx context.Context) error {
	var broken error
	if a := l.auth.Load(); a != nil {
		if err := a.release(ctx); errors.Is(err, errInUse) || errors.Is(err, errLockTimeout) {
			return err
		} else if err != nil {
			broken = err // a file made unusable under us: shut down all the same
		}
	}
	err := l.lock(ctx, "xproc.Close")
	switch {
	case errors.Is(err, errClosed):
		return nil
	case errors.Is(err, errLockTimeout):
		return err
	case err == nil:
		if l.slot >= 0 && int(l.load(l.sw(l.slot, sPID))) == l.pid {
			l.freeSlotLocked(l.slot)
		}
		l.closed = true
		l.unlock()
	default:
		l.sem <- struct{}{}
		closed := l.closed
		l.closed = true
		<-l.sem
		if closed {
			return nil
		}
		if broken == nil {
			broken = err
		}
	}
	l.shutdown()
	if broken != nil {
		var le *ledgerError
		if errors.As(broken, &le) && le.Op == "" {
			le.Op = "xproc.Close"
		}
	}
	return broken
}

// shutdown stops the watcher and the settler, unmaps and closes the file.
func (l *Ledger) shutdown() {
	l.cancel()
	if l.stop >= 0 {
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(l.stop, one[:])
		<-l.done
		unix.Close(l.stop)
	}
	if l.settled != nil {
		<-l.settled
	}
	_ = unix.Munmap(l.mem)
	l.f.Close()
}

// Inspect is InspectContext with a context bounded by DefaultLockTimeout.
func Inspect(path string) (Header, []Slot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultLockTimeout)
	defer cancel()
	return InspectContext(ctx, path)
}

// InspectContext reads a ledger file without joining it (the operator's
// view, memctl): opened read-only and checked as Open checks it, read under
// a shared lock taken before ctx ends (and within DefaultLockTimeout),
// checked by parse.
func InspectContext(ctx context.Context, path string) (Header, []Slot, error) {
	const op = "xproc.Inspect"
	f, err := openFile(op, path, unix.O_RDONLY, anyGroup)
	if err != nil {
		return Header{}, nil, err
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := lockFile(ctx, op, path, fd, unix.LOCK_SH, DefaultLockTimeout); err != nil {
		return Header{}, nil, err
	}
	defer unlockFile(fd)
	b, err := readImage(f)
	if err != nil {
		return Header{}, nil, &ledgerError{Op: op, Path: path, Err: err}
	}
	h, s, err := parse(b)
	if err != nil {
		e := err.(*ledgerError)
		e.Op, e.Path = op, path
		return h, s, e
	}
	return h, s, nil
}
