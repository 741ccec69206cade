package plugin

import (
	"errors"
	"fmt"

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
	// ErrUndeclared: the descriptor names a plugin the spec does not declare
	// under plugin_abi.plugins, or a device other than the declared one.
	ErrUndeclared = errors.New("plugin: not declared in the spec")
)

// ErrProtocol is the kind of the *memapi.Error a call returns when the plugin
// broke the ABI's contract during the call: a status the header does not
// declare, a handle id that is zero, already live or not the one passed in, a
// size smaller than asked for, or a panic on the Go side of the call. The
// host stays up and its accounting stays exact: whatever the plugin may still
// hold is visible in UsedBytes.
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
// and one of kind ErrProtocol for any other value.
func (m *Mechanism) statusError(op string, code int32, h memapi.HandleID) error {
	if code == 0 {
		return nil
	}
	if code < 0 || int(code) >= len(statusKinds) {
		return m.protocol(op, h, "the plugin returned status %d, which the ABI does not declare", code)
	}
	return &memapi.Error{Op: op, Kind: statusKinds[code], Mechanism: m.info.Mechanism, Authority: m.info.Authority,
		Handle: h, Detail: "plugin " + string(m.info.Mechanism) + " returned " + statusNames[code]}
}

// protocol is an *memapi.Error of kind ErrProtocol.
func (m *Mechanism) protocol(op string, h memapi.HandleID, format string, args ...any) error {
	return &memapi.Error{Op: op, Kind: ErrProtocol, Mechanism: m.info.Mechanism, Authority: m.info.Authority,
		Handle: h, Detail: fmt.Sprintf(format, args...)}
}
