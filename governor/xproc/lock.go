package xproc

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// The file lock is flock(2): the kernel drops it when its holder dies,
// however it dies, so it is robust by construction. But flock waits
// without a bound, and a holder that is alive and stopped (SIGSTOP, a
// cgroup freezer, a debugger, D-state) would hold every other process
// forever. So the lock is taken with LOCK_NB and retried with a backoff
// until the caller's context ends or the lock timeout passes, whichever
// comes first (a caller with no deadline still gets one); then the caller
// gets a *lockError naming the processes that hold the lock and their
// state, read from /proc/locks and /proc/PID/stat.

// lockBackoff bounds the sleep between two tries: the first is
// lockBackoffMin, each next one twice the last.
const (
	lockBackoffMin = 20 * time.Microsecond
	lockBackoffMax = 2 * time.Millisecond
)

// DefaultLockTimeout bounds every wait for the ledger's lock, unless
// Options.LockTimeout sets another bound: the calls that take no context
// (Open, Inspect, State, Close) wait at most that long, and the calls that
// take one (OpenContext, InspectContext, SetCapacity, CloseContext) and
// reservations until their context ends or that long, whichever comes
// first.
const DefaultLockTimeout = 5 * time.Second

// lockFile takes the file lock how (unix.LOCK_EX or unix.LOCK_SH) on fd
// before ctx ends and within bound (a lock timeout: every wait for the
// lock has one, whatever ctx says), or returns a *lockError (or a
// *ledgerError when flock itself fails).
func lockFile(ctx context.Context, op, path string, fd int, how int, bound time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := time.Now()
	backoff := lockBackoffMin
	var timer *time.Timer
	for {
		err := unix.Flock(fd, how|unix.LOCK_NB)
		if err == nil {
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return &ledgerError{Op: op, Path: path, Err: err, Detail: "flock"}
		}
		if ctx.Err() != nil {
			return lockTimeout(ctx, op, path, fd, start)
		}
		if timer == nil {
			timer = time.NewTimer(backoff)
		} else {
			timer.Reset(backoff)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return lockTimeout(ctx, op, path, fd, start)
		}
		backoff = min(2*backoff, lockBackoffMax)
	}
}

// unlockFile drops the file lock.
func unlockFile(fd int) {
	for unix.Flock(fd, unix.LOCK_UN) == unix.EINTR {
	}
}

// lockTimeout is the *lockError of a wait on fd's lock that ctx ended.
func lockTimeout(ctx context.Context, op, path string, fd int, start time.Time) *lockError {
	return &lockError{Op: op, Path: path, Waited: time.Since(start), Holders: lockHolders(fd), Err: context.Cause(ctx)}
}

// lockHolders returns the processes that hold a flock on fd's file, with
// their state, from /proc/locks (whose PIDs are those of the reader's PID
// namespace); nil when none or unreadable.
func lockHolders(fd int) []lockHolder {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return nil
	}
	id := []byte(fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino))
	f, err := os.Open("/proc/locks")
	if err != nil {
		return nil
	}
	defer f.Close()
	var hs []lockHolder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// "1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF"; a waiter's
		// line has "->" after the number (none wait here: LOCK_NB).
		fs := bytes.Fields(sc.Bytes())
		if len(fs) < 6 || string(fs[1]) != "FLOCK" || !bytes.Equal(fs[5], id) {
			continue
		}
		pid, err := strconv.Atoi(string(fs[4]))
		if err != nil || pid <= 0 {
			continue
		}
		hs = append(hs, lockHolder{PID: pid, State: processState(pid)})
	}
	return hs
}

// processState is the state of process pid from field 3 of
// /proc/PID/stat, in words.
func processState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "gone"
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return "unknown"
	}
	switch b[i+2] {
	case 'R':
		return "running"
	case 'S':
		return "sleeping"
	case 'D':
		return "disk-sleep"
	case 'T':
		return "stopped"
	case 't':
		return "traced"
	case 'Z':
		return "zombie"
	case 'X':
		return "dead"
	case 'I':
		return "idle"
	}
	return "state " + string(b[i+2])
}
