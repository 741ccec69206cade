//go:build memgentmpl

package fakes

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// Fault makes a fake fail chosen calls before they change any state.
//
// Method names the method (as in the spec, e.g. "Commit"). Nth selects the
// Nth call of that method on this fake counted from 1, including calls made
// before Inject; 0 selects every call. When, if set, must also hold for the
// call (it sees the method and the arguments). Err is the error returned: an
// error that is already an *memapi.Error is returned as is, any other is
// wrapped in an *memapi.Error whose Kind is Err and whose cause is
// memapi.ErrInjected, so errors.Is(result, Err) holds either way.
//
// A Fault is a memapi.Rule on the fake's layer: Inject(f) is
// InjectWith(memapi.Fail(f.Err).On("fakes", f.Method).When(...)).
type Fault struct {
	Method string
	Nth    int
	When   func(Call) bool
	Err    error
}

// Layer is the memapi.Op.Layer of the fakes' operations.
const Layer = "fakes"

// faults is the fault injector every fake embeds: a memapi.FaultSet asked
// before every method with an error result, with the operation
//
//	memapi.Op{Layer: "fakes", Name: method, Call: n, Args: call}
//
// where n is the call's number among this fake's calls of the method
// (counting from 1, calls before any injection included) and call is the
// Call being made (its Args are set whenever a fault is injected). Bytes and
// Authority are zero: the fake does not read its arguments for the
// injector. Only methods with an error result can fail; a Fault that names
// any other method panics, so a typo does not silently test nothing.
type faults struct {
	mu      sync.Mutex
	source  string
	methods []string       // the methods that can fail, sorted
	counts  map[string]int // calls seen per method
	set     memapi.FaultSet
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
	nth, when := ft.Nth, ft.When
	f.set.Add(memapi.Fail(ft.Err).On(Layer, ft.Method).When(func(op memapi.Op) bool {
		return (nth == 0 || op.Call == nth) && (when == nil || when(op.Args.(Call)))
	}))
}

// InjectWith adds any injector: it is asked before every call of a method
// that can fail, after the faults and injectors added before it, with the
// operation described on the fakes' Layer; its error is returned as a
// Fault's Err is.
func (f *faults) InjectWith(i memapi.Injector) { f.set.Add(i) }

// ClearFaults removes every injected fault and injector. Call counts are
// kept.
func (f *faults) ClearFaults() { f.set.Clear() }

// armed reports whether any fault or injector is injected.
func (f *faults) armed() bool { return !f.set.Empty() }

// check counts the call and returns the error of the first fault or injector
// that fails it, or nil. The injectors run outside the fake's lock, so they
// may call the fake.
func (f *faults) check(c *Call) error {
	f.mu.Lock()
	f.counts[c.Method]++
	n := f.counts[c.Method]
	f.mu.Unlock()
	if f.set.Empty() {
		return nil
	}
	if err := f.set.MaybeError(memapi.Op{Layer: Layer, Name: c.Method, Call: n, Args: *c}); err != nil {
		return memapi.Injected(err, &memapi.Error{Op: f.source + "." + c.Method, Detail: fmt.Sprintf("injected fault on call %d", n)})
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
