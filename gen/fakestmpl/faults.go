//go:build memgentmpl

package fakes

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// Fault makes a fake fail chosen calls before they change any state.
//
// Method names the method (as in the spec, e.g. "Commit"). Nth selects the
// Nth call of that method on this fake counted from 1, including calls made
// before Inject; 0 selects every call. When, if set, must also hold for the
// call (it sees the method and the arguments). Err is the error returned: an
// error that is already an *memapi.Error is returned as is, any other is
// wrapped in an *memapi.Error whose Kind is Err, so errors.Is(result, Err)
// holds either way.
type Fault struct {
	Method string
	Nth    int
	When   func(Call) bool
	Err    error
}

// faults is the fault injector every fake embeds. Only methods with an error
// result can fail; injecting a fault into any other name panics, so a typo
// does not silently test nothing.
type faults struct {
	mu      sync.Mutex
	source  string
	methods []string       // the methods that can fail, sorted
	counts  map[string]int // calls seen per method
	list    []Fault
	on      atomic.Bool // some fault is injected: calls build their arguments
}

func (f *faults) init(source string, methods []string) {
	f.source = source
	f.methods = methods
	f.counts = make(map[string]int, len(methods))
}

// Inject adds a fault. It panics when the fault names no method of this fake
// that returns an error, or carries no error.
func (f *faults) Inject(ft Fault) {
	if _, ok := slices.BinarySearch(f.methods, ft.Method); !ok {
		panic(fmt.Sprintf(
			"fakes: %s has no method %q that can fail (have %s)",
			f.source,
			ft.Method,
			strings.Join(f.methods, ", "),
		))
	}
	if ft.Err == nil {
		panic("fakes: Fault.Err is nil")
	}
	if ft.Nth < 0 {
		panic("fakes: Fault.Nth is negative")
	}
	f.mu.Lock()
	f.list = append(f.list, ft)
	f.on.Store(true)
	f.mu.Unlock()
}

// ClearFaults removes every injected fault. Call counts are kept.
func (f *faults) ClearFaults() {
	f.mu.Lock()
	f.list = nil
	f.on.Store(false)
	f.mu.Unlock()
}

// armed reports whether any fault is injected.
func (f *faults) armed() bool { return f.on.Load() }

// check counts the call and returns the error of the first fault that selects
// it, or nil. Predicates run outside the lock, so they may call the fake.
func (f *faults) check(c *Call) error {
	f.mu.Lock()
	f.counts[c.Method]++
	n := f.counts[c.Method]
	var cands []Fault
	for _, ft := range f.list {
		if ft.Method == c.Method && (ft.Nth == 0 || ft.Nth == n) {
			cands = append(cands, ft)
		}
	}
	f.mu.Unlock()
	for _, ft := range cands {
		if ft.When != nil && !ft.When(*c) {
			continue
		}
		var me *memapi.Error
		if errors.As(ft.Err, &me) {
			return ft.Err
		}
		return &memapi.Error{
			Op:     f.source + "." + c.Method,
			Kind:   ft.Err,
			Detail: fmt.Sprintf("injected fault on call %d", n),
		}
	}
	return nil
}

// errNoBehaviour is what a fake method returns when the spec declares it but
// the fakes' state model has no behaviour for it yet: the method still
// records, counts, takes stubs and canned results and can be faulted.
func errNoBehaviour(op string) error {
	return &memapi.Error{
		Op:     op,
		Kind:   memapi.ErrUnsupported,
		Detail: "the fake has no behaviour for this method yet",
	}
}
