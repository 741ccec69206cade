package driver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/ebitengine/purego"
)

// Library is the soname of the CUDA driver.
const Library = "libcuda.so.1"

// LoadError says why the driver library could not be bound: the library did
// not open (Symbol is empty) or a symbol is missing.
type LoadError struct {
	Library string
	Symbol  string // the missing symbol; empty when the library itself did not open
	Err     error  // dlerror's message, which may be empty: never judged by it
}

func (e *LoadError) Error() string {
	if e.Symbol == "" {
		return fmt.Sprintf("cannot open %s: %v", e.Library, e.Err)
	}
	return fmt.Sprintf("%s has no symbol %s: %v", e.Library, e.Symbol, e.Err)
}

func (e *LoadError) Unwrap() error { return e.Err }

var errNoHandle = errors.New("dlopen returned no handle")

var (
	openMu sync.Mutex
	opened = map[string]*Table{}
)

// Open binds the table to libcuda.so.1. A successful binding is cached: every
// caller gets the same *Table, and the library is never closed (threads hold
// CUDA contexts for the life of the process).
func Open() (*Table, error) { return OpenLibrary(Library) }

// OpenLibrary binds the table to the library at path (a soname or a file).
// It is Open for tests and unusual installs.
func OpenLibrary(path string) (*Table, error) {
	openMu.Lock()
	defer openMu.Unlock()
	if t, ok := opened[path]; ok {
		return t, nil
	}
	t, err := load(path)
	if err != nil {
		return nil, err
	}
	opened[path] = t
	return t, nil
}

// load runs on a locked OS thread: dlerror's state is per thread, and the
// handle and symbol addresses are judged by being non-zero, never by the
// message (seen empty when the goroutine moved between threads).
func load(path string) (*Table, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil || h == 0 {
		if err == nil {
			err = errNoHandle
		}
		return nil, &LoadError{Library: path, Err: err}
	}
	t := &Table{Source: path}
	for _, e := range t.Entries() {
		addr, err := lookup(h, e.Symbols)
		if addr == 0 {
			_ = purego.Dlclose(h)
			return nil, &LoadError{Library: path, Symbol: e.Symbols[0], Err: err}
		}
		// RegisterFunc only after Dlsym found the symbol: RegisterLibFunc
		// would panic on a missing one.
		purego.RegisterFunc(e.Field, addr)
	}
	return t, nil
}

func lookup(h uintptr, symbols []string) (uintptr, error) {
	var first error
	for _, s := range symbols {
		addr, err := purego.Dlsym(h, s)
		if err == nil && addr != 0 {
			return addr, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = errors.New("dlsym returned no address")
	}
	return 0, first
}
