package xproc

import (
	"errors"
	"fmt"
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
