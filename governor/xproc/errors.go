package xproc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// ErrBadLedger is what a ledger file that cannot be used as one fails
// with, whatever is wrong with it (errors.Is matches it): truncated, not a
// ledger file, another version's, corrupt, or unsafe to open (another
// owner, a link, writable by others). The error's text says which. The
// file is never repaired in place: remove it once no process uses it.
var ErrBadLedger = errors.New("xproc: bad ledger file")

// The kinds of a *ledgerError. Each wraps the exported error a caller
// matches with errors.Is: ErrBadLedger for a bad file, memapi's kinds for
// the rest, context.DeadlineExceeded for a lock not taken in time.
var (
	errTruncated = fmt.Errorf("xproc: ledger file truncated: %w", ErrBadLedger)
	errForeign   = fmt.Errorf("xproc: not a ledger file: %w", ErrBadLedger)
	errVersion   = fmt.Errorf("xproc: ledger file of another version: %w", ErrBadLedger)
	errCorrupt   = fmt.Errorf("xproc: ledger file corrupt: %w", ErrBadLedger)
	errUnsafe    = fmt.Errorf("xproc: unsafe ledger file: %w", ErrBadLedger)
	errFull      = fmt.Errorf("xproc: every slot of the ledger is taken: %w", memapi.ErrUnavailable)
	errClosed    = fmt.Errorf("xproc: ledger closed: %w", memapi.ErrClosed)
	errInUse     = fmt.Errorf("xproc: bytes still in use: %w", memapi.ErrInUse)
	// errOwnHolder is the Admission's answer to its own pressure holder's
	// reservations: declined (memapi.ErrUnavailable), so they never claim.
	errOwnHolder = fmt.Errorf("xproc: the ledger's pressure holder is not admitted: %w", memapi.ErrUnavailable)
	// errNamespace refuses a process that would join from another PID
	// namespace than the ledger's members: liveness is read from /proc
	// by PID, and a PID names another process there.
	errNamespace = fmt.Errorf("xproc: the ledger's members are in another PID namespace: %w", memapi.ErrUnsupported)
	// errLockTimeout is the kind of a *lockError: the ledger's lock was
	// not taken before the caller's deadline.
	errLockTimeout = fmt.Errorf("xproc: the ledger's lock was not taken before the deadline: %w", context.DeadlineExceeded)
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
	if e.Err != nil && e.Err != context.DeadlineExceeded && e.Err != context.Canceled {
		b.WriteString("; the wait ended: " + e.Err.Error()) // a cause of its own (the governor's default wait)
	}
	return b.String()
}

func (e *lockError) Unwrap() []error { return []error{errLockTimeout, e.Err} }
