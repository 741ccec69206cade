package xproc

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Outcome says what became of a limits change: "applied", "deferred" or
// "refused".
type Outcome string

const (
	// Applied: the new capacity holds now; the claims fit under it.
	Applied Outcome = "applied"
	// Deferred: the new capacity holds for every new claim at once, but
	// the processes' claims exceed it; it is fully in force once they
	// give back Excess bytes (they do as their memory is freed, and the
	// pressure of any refused claim asks them to).
	Deferred Outcome = "deferred"
	// Refused: nothing changed (a stale revision, or a capacity of 0 or
	// beyond the largest figure).
	Refused Outcome = "refused"
)

// LimitChange is the answer to SetCapacity.
type LimitChange struct {
	Outcome  Outcome
	Revision uint64 // the revision now in force (the old one when refused)
	Capacity uint64 // the capacity now in force
	Claimed  uint64 // the sum of the claims when the change was made
	Excess   uint64 // Deferred: the claims beyond the new capacity
	Reason   string // Refused: why
}

// SetCapacity changes the shared capacity of the ledger at path while its
// processes run. expect, when not 0, is the revision the operator last
// read: a change made on a stale view is Refused. A change bumps the
// revision and is Applied or Deferred (see Outcome); every watcher sees
// it. The file is checked as Open checks it, and a lock not taken before
// ctx ends (or DefaultLockTimeout passes) is an error naming its holders.
func SetCapacity(ctx context.Context, path string, capacity, expect uint64) (LimitChange, error) {
	const op = "xproc.SetCapacity"
	f, err := openFile(op, path, unix.O_RDWR, anyGroup)
	if err != nil {
		return LimitChange{}, err
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := lockFile(ctx, op, path, fd, unix.LOCK_EX, DefaultLockTimeout); err != nil {
		return LimitChange{}, err
	}
	defer unlockFile(fd)
	b, err := readImage(f)
	if err != nil {
		return LimitChange{}, &ledgerError{Op: op, Path: path, Err: err}
	}
	h, _, err := parse(b)
	if err != nil {
		e := err.(*ledgerError)
		e.Op, e.Path = op, path
		return LimitChange{}, e
	}
	mem, err := unix.Mmap(fd, 0, fileSize(h.Slots), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return LimitChange{}, &ledgerError{Op: op, Path: path, Err: err, Detail: "mmap"}
	}
	defer unix.Munmap(mem)
	l := &Ledger{mem: mem, slots: h.Slots, pid: os.Getpid(), slot: -1}
	l.beginLocked()
	defer l.sealLocked()
	ch := LimitChange{Revision: l.load(l.hw(hRevision)), Capacity: l.load(l.hw(hCapacity)), Claimed: l.load(l.hw(hClaimed))}
	switch {
	case expect != 0 && expect != ch.Revision:
		ch.Outcome, ch.Reason = Refused, fmt.Sprintf("stale revision %d, the ledger is at %d", expect, ch.Revision)
		return ch, nil
	case capacity == 0 || capacity > maxBytes:
		ch.Outcome, ch.Reason = Refused, fmt.Sprintf("capacity %d outside 1 to %d", capacity, maxBytes)
		return ch, nil
	}
	l.store(l.hw(hCapacity), capacity)
	l.add(l.hw(hRevision), 1)
	ch.Revision, ch.Capacity, ch.Outcome = ch.Revision+1, capacity, Applied
	if ch.Claimed > capacity {
		ch.Outcome, ch.Excess = Deferred, ch.Claimed-capacity
		// Ask the processes for the excess, as a refused claim does:
		// they split it among them, issue tickets to their holders and
		// give back what is freed. It ends once the claims fit.
		l.store(l.hw(hWant), ch.Excess)
		l.store(l.hw(hWantLeft), ch.Excess)
		l.store(l.hw(hWantOut), 0)
		l.add(l.hw(hOpSeq), 1)
		l.add(l.hw(hWantSeq), 1)
	}
	return ch, nil
}
