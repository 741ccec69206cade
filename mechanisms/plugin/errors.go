package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Why a plugin did not load. A *LoadError wraps exactly one of them; compare
// with errors.Is.
var (
	// ErrNoLibrary: the shared library did not open.
	ErrNoLibrary = errors.New("plugin: library does not open")
	// ErrNoEntry: the library does not export the entry point of this major
	// (EntrySymbol).
	ErrNoEntry = errors.New("plugin: no entry point")
	// ErrNullDescriptor: the entry point returned NULL (the plugin cannot
	// serve this host).
	ErrNullDescriptor = errors.New("plugin: entry point returned no descriptor")
	// ErrIncompatible: the descriptor or one of its structs is of another
	// major version of the ABI than this host's.
	ErrIncompatible = errors.New("plugin: incompatible ABI major version")
	// ErrBadDescriptor: the descriptor breaks the ABI: a struct_size too
	// small, a missing required slot, a bad granularity, an invalid device.
	ErrBadDescriptor = errors.New("plugin: malformed descriptor")
	// ErrUndeclared: Open was given an allow-list (WithAllowList,
	// SpecAllowList) and the descriptor names a plugin not on it, or a device
	// other than the listed one.
	ErrUndeclared = errors.New("plugin: not on the allow-list")
)

// ErrProtocol is the kind of the *memapi.Error a call returns when the plugin
// broke the ABI's contract during the call: a status the header does not
// declare, an assigned id it changed, an id the host holds live that it
// answers ErrReleased for, a size other than asked for, or a panic on the Go
// side of the call. The host stays up and its accounting stays exact: what
// the plugin still holds and no handle can release is quarantined
// (Mechanism.Quarantined) and visible in UsedBytes.
var ErrProtocol = errors.New("plugin: protocol violation")

// LoadError says why Open or New refused a plugin.
type LoadError struct {
	Path   string
	Kind   error  // one of the Err* sentinels of this package
	Detail string // what exactly was wrong
	Err    error  // the underlying cause (dlerror's message), or nil
}

func (e *LoadError) Error() string {
	s := fmt.Sprintf("%s: %s", e.Path, e.Kind)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the kind and the cause.
func (e *LoadError) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Kind}
	}
	return []error{e.Kind, e.Err}
}

func loadErr(path string, kind error, format string, args ...any) *LoadError {
	return &LoadError{Path: path, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// statusError turns a slot's status into the contract's error: nil for
// MEMGEN_OK, an *memapi.Error of the matching sentinel for a declared code,
// and one of kind ErrProtocol for any other value. msg is the plugin's
// last_error message, if any.
func (m *Mechanism) statusError(op string, code int32, h memapi.HandleID, msg string) error {
	if code == 0 {
		return nil
	}
	if code < 0 || int(code) >= len(statusKinds) {
		return m.protocol(op, h, "the plugin returned status %d, which the ABI does not declare", code)
	}
	d := "plugin " + string(m.info.Mechanism) + " returned " + statusNames[code]
	if msg != "" {
		d += ": " + msg
	}
	return &memapi.Error{Op: op, Kind: statusKinds[code], Mechanism: m.info.Mechanism, Authority: m.info.Authority,
		Handle: h, Detail: d}
}

// fault asks Options.Faults whether the call of slot fn, made by the
// contract operation op (on handle h, about n bytes), fails, and returns
// the error the call then has (see Options.Faults).
func (m *Mechanism) fault(op string, h memapi.HandleID, fn uintptr, n memapi.Bytes) error {
	err := m.faults.MaybeError(memapi.Op{Layer: Layer, Name: m.lib.slotName(fn), Bytes: n, Authority: m.info.Authority, Args: op})
	if err == nil {
		return nil
	}
	var me *memapi.Error
	if errors.As(err, &me) {
		return err
	}
	e := &memapi.Error{Op: op, Kind: err, Mechanism: m.info.Mechanism, Authority: m.info.Authority, Handle: h,
		Detail: "plugin " + string(m.info.Mechanism) + ": injected fault", Err: memapi.ErrInjected}
	for code, k := range statusKinds {
		if k != nil && errors.Is(err, k) {
			e.Kind = k
			e.Detail = "plugin " + string(m.info.Mechanism) + " returned " + statusNames[code] + ": injected fault"
			break
		}
	}
	return e
}

// protocol is an *memapi.Error of kind ErrProtocol; it is counted and
// logged.
func (m *Mechanism) protocol(op string, h memapi.HandleID, format string, args ...any) error {
	m.protocols.Add(1)
	e := &memapi.Error{Op: op, Kind: ErrProtocol, Mechanism: m.info.Mechanism, Authority: m.info.Authority,
		Handle: h, Detail: fmt.Sprintf(format, args...)}
	if m.log != nil {
		m.log.Warn("memgen plugin: protocol violation", "plugin", string(m.info.Mechanism), "op", op, "detail", e.Detail)
	}
	return e
}

// ErrOverran is what an *OverrunError matches with errors.Is, besides
// context.DeadlineExceeded.
var ErrOverran = errors.New("plugin: slot overran its deadline")

// OverrunError is the error of a call whose consuming slot returned past its
// deadline. A C slot cannot be preempted: the host learns of the overrun
// when the slot returns, gives back what it created (a copy_on_write is
// kept, since the view it replaced is gone), counts it (Mechanism.Overruns)
// and logs a line.
type OverrunError struct {
	Op        string
	Mechanism memapi.MechanismID
	Budget    time.Duration // the time the slot had
	Took      time.Duration // the time it took
}

func (e *OverrunError) Error() string {
	return fmt.Sprintf("%s: plugin %s took %v, past its deadline of %v: its result was given back", e.Op, e.Mechanism, e.Took.Round(time.Millisecond), e.Budget.Round(time.Millisecond))
}

// Is matches ErrOverran and context.DeadlineExceeded.
func (e *OverrunError) Is(target error) bool {
	return target == ErrOverran || target == context.DeadlineExceeded
}

// isKind reports whether err is a *memapi.Error of the given kind (or wraps
// one).
func isKind(err, kind error) bool { return err != nil && errors.Is(err, kind) }

// joinErr joins two errors, either of which may be nil.
func joinErr(a, b error) error {
	if a == nil {
		return b
	}
	return errors.Join(a, b)
}
