package xproc

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The kinds of a *LedgerError.
var (
	ErrTruncated = errors.New("xproc: ledger file truncated")
	ErrForeign   = errors.New("xproc: not a ledger file")
	ErrVersion   = errors.New("xproc: ledger file of another version")
	ErrCorrupt   = errors.New("xproc: ledger file corrupt")
	ErrFull      = errors.New("xproc: every slot of the ledger is taken")
	ErrClosed    = errors.New("xproc: ledger closed")
	ErrInUse     = errors.New("xproc: bytes still in use")
	ErrUnsafe    = errors.New("xproc: unsafe ledger file")
	// ErrNamespace refuses a process that would join from another PID
	// namespace than the ledger's members: liveness is read from /proc
	// by PID, and a PID names another process there.
	ErrNamespace = errors.New("xproc: the ledger's members are in another PID namespace")
	// ErrLockTimeout is the kind of a *LockError: the ledger's lock was
	// not taken before the caller's deadline.
	ErrLockTimeout = errors.New("xproc: the ledger's lock was not taken before the deadline")
)

// LedgerError is the typed failure of opening, checking or using a ledger
// file. errors.Is matches its Err.
type LedgerError struct {
	Op     string
	Path   string
	Err    error
	Detail string
}

func (e *LedgerError) Error() string {
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

func (e *LedgerError) Unwrap() error { return e.Err }

func ledgerErr(op, path string, err error, format string, args ...any) *LedgerError {
	return &LedgerError{Op: op, Path: path, Err: err, Detail: fmt.Sprintf(format, args...)}
}

// LockHolder is a process that held the ledger's file lock when a caller
// gave up waiting for it, and its state then.
type LockHolder struct {
	PID   int
	State string // from /proc/PID/stat: running, sleeping, disk-sleep, stopped, traced, zombie, idle, or gone
}

// LockError is the failure of a call that waited for the ledger's lock
// until its context ended (a lock holder stopped by SIGSTOP, a cgroup
// freezer or a debugger, or stuck in the kernel). errors.Is matches
// ErrLockTimeout and the context's error.
type LockError struct {
	Op      string
	Path    string
	Waited  time.Duration
	Holders []LockHolder // the processes holding the file lock then (from /proc/locks); none when it was this process's own
	Err     error        // the context's cause
}

func (e *LockError) Error() string {
	var b strings.Builder
	if e.Op != "" {
		b.WriteString(e.Op + ": ")
	}
	b.WriteString(ErrLockTimeout.Error())
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

func (e *LockError) Unwrap() []error { return []error{ErrLockTimeout, e.Err} }
