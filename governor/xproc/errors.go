package xproc

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The kinds of a *ledgerError.
var (
	errTruncated = errors.New("xproc: ledger file truncated")
	errForeign   = errors.New("xproc: not a ledger file")
	errVersion   = errors.New("xproc: ledger file of another version")
	errCorrupt   = errors.New("xproc: ledger file corrupt")
	errFull      = errors.New("xproc: every slot of the ledger is taken")
	errClosed    = errors.New("xproc: ledger closed")
	errInUse     = errors.New("xproc: bytes still in use")
	errUnsafe    = errors.New("xproc: unsafe ledger file")
	// errNamespace refuses a process that would join from another PID
	// namespace than the ledger's members: liveness is read from /proc
	// by PID, and a PID names another process there.
	errNamespace = errors.New("xproc: the ledger's members are in another PID namespace")
	// errLockTimeout is the kind of a *lockError: the ledger's lock was
	// not taken before the caller's deadline.
	errLockTimeout = errors.New("xproc: the ledger's lock was not taken before the deadline")
)

// ledgerError is the typed failure of opening, checking or using a ledger
// file. errors.Is matches its Err.
type ledgerError struct {
	Op     string
	Path   string
	Err    error
	Detail string
}

func (e *ledgerError) Error() string {
	s := e.Err.Error()
	if e.Op != "" {
		s = e.Op + ": " + s
	}
	if e.Path != "" {
		s += " (" + e.Path + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *ledgerError) Unwrap() error { return e.Err }

func ledgerErr(op, path string, err error, format string, args ...any) *ledgerError {
	return &ledgerError{Op: op, Path: path, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// lockHolder is a process that held the ledger's file lock when a caller
// gave up waiting for it, and its state then.
type lockHolder struct {
	PID   int
	State string // from /proc/PID/stat: running, sleeping, disk-sleep, stopped, traced, zombie, idle, or gone
}

// lockError is the failure of a call that waited for the ledger's lock
// until its context ended (a lock holder stopped by SIGSTOP, a cgroup
// freezer or a debugger, or stuck in the kernel). errors.Is matches
// errLockTimeout and the context's error.
type lockError struct {
	Op      string
	Path    string
	Waited  time.Duration
	Holders []lockHolder // the processes holding the file lock then (from /proc/locks); none when it was this process's own
	Err     error        // the context's cause
}

func (e *lockError) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op + ": ")
	}
	b.WriteString(errLockTimeout.Error())
	if e.Path != "" {
		b.WriteString(" (" + e.Path + ")")
	}
	fmt.Fprintf(&b, ": waited %v", e.Waited.Round(time.Millisecond))
	for i, h := range e.Holders {
		if i == 0 {
			b.WriteString("; held by")
		} else {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " pid %d (%s)", h.PID, h.State)
	}
	if len(e.Holders) == 0 {
		b.WriteString("; no other process holds the file lock (a call of this process holds it)")
	}
	return b.String()
}

func (e *lockError) Unwrap() []error { return []error{errLockTimeout, e.Err} }
