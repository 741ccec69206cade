package xproc

import (
	"bytes"
	"os"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// startTime returns the start time of process pid, in clock ticks after
// boot (field 22 of /proc/PID/stat), or 0 when no such process exists. A
// slot records it beside the PID: a PID the kernel gave to a new process
// after the slot's owner died has another start time.
func startTime(pid int) uint64 {
	if h := livenessHook.Load(); h != nil {
		(*h)(pid)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces
	// and parentheses: the fields after it follow the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 {
		return 0
	}
	if f[0][0] == 'Z' || f[0][0] == 'X' {
		return 0 // a zombie has released its memory: it is dead to the ledger
	}
	v, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// watchProcess returns a pidfd of the process that owns a slot (pid, start),
// or -1 when that process is gone: the PID is free, or it names a process
// with another start time. The start time is read after the pidfd is
// open, so a pidfd that names a successor is never kept.
func watchProcess(pid int, start uint64) int {
	if h := livenessHook.Load(); h != nil {
		(*h)(pid)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1
	}
	if startTime(pid) != start {
		unix.Close(fd)
		return -1
	}
	return fd
}

// alive reports whether the process that owns a slot (pid, start) still runs.
func alive(pid int, start uint64) bool {
	return start != 0 && startTime(pid) == start
}

// livenessHook, when set, is called with the PID before each liveness read
// (tests only: they hold a read to see whether the ledger's lock is held
// meanwhile).
var livenessHook atomic.Pointer[func(pid int)]

// pidNamespace is the inode of this process's PID namespace
// (/proc/self/ns/pid), or 0 when it cannot be read.
func pidNamespace() uint64 {
	var st unix.Stat_t
	if unix.Stat("/proc/self/ns/pid", &st) != nil {
		return 0
	}
	return st.Ino
}
