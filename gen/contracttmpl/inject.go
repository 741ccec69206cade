//go:build memgentmpl

package memapi

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrInjected marks a failure that an Injector caused. A layer reports an
// injected error as the failure it stands for, so that the code above takes
// the path a real failure takes and a test of it proves something:
//
//   - a layer that returns this contract's errors (fakes, a ledger, a plugin
//     host) returns an *Error it is given as is, and puts any other error e
//     in an *Error whose Kind is e and whose cause (Err) is ErrInjected;
//   - a layer that stands for a system call or a driver call takes e for
//     that call's failure: it classifies e as it classifies the call's own
//     errors (an errno, a status code, or a kind of this contract itself)
//     and keeps e, marked with ErrInjected, as the cause.
//
// So errors.Is(err, e) holds for the error a Rule failed with, and
// errors.Is(err, ErrInjected) tells an injected failure from a real one,
// wherever the layer's error carries a cause. A layer that can return only a
// code (a simulated driver's status) returns the code e carries and cannot
// mark it. Each layer's documentation says what it does.
var ErrInjected = errors.New("memapi: injected fault")

// Op is one operation a layer is about to perform, as its Injector sees it.
type Op struct {
	// Layer names the layer that asks: memgen's are "fakes", "cpu",
	// "cudasim", "plugin" and "governor".
	Layer string
	// Name is the operation within the layer: a method ("Commit"), a system
	// call ("mmap"), a driver entry point ("cuMemMap"), a plugin slot
	// ("commit"), a ledger operation ("Grant.Draw").
	Name string
	// Call is the operation's number among the calls of Name that the
	// layer's instance has made, counting from 1 (this one included), for a
	// layer that counts them; 0 for one that does not.
	Call int
	// Bytes is the size the operation is about, when it has one.
	Bytes Bytes
	// Authority is the authority the operation's bytes are accounted to,
	// when the layer knows it.
	Authority AuthorityID
	// Args is whatever else the layer passes (see its documentation), or
	// nil.
	Args any
}

// String returns "Layer.Name".
func (op Op) String() string { return op.Layer + "." + op.Name }

// Injector decides whether an operation fails. Every layer of a runtime
// that can fail for a reason outside its caller's control (a fake, a
// mechanism's system calls, a simulated driver, a plugin's C slots, the
// ledger) can be given one, and asks it once per such operation, at the
// point where the operation has changed nothing yet: nil lets the operation
// run, an error makes it fail there as if the thing below had refused (see
// ErrInjected for how it is reported), and the layer cleans up as it would
// after a real refusal. A layer without an injector (the default) pays one
// nil check per operation.
//
// Rules (Fail) say which operations fail, and they compose:
//
//	inj := memapi.Any(
//		memapi.Fail(unix.ENOMEM).On("cpu", "mmap").Nth(3), // the third mmap from now
//		memapi.Fail(memapi.ErrOutOfMemory).On("fakes", "Commit").When(memapi.Randomly(0.1, seed)),
//	)
//
// Layers call MaybeError from any goroutine, concurrently, and some hold a
// lock of their own while they do: an Injector must be safe for concurrent
// use and must not call back into the layer that asks.
type Injector interface {
	MaybeError(op Op) error
}

// InjectorFunc is an Injector made of a function.
type InjectorFunc func(op Op) error

// MaybeError returns f(op).
func (f InjectorFunc) MaybeError(op Op) error { return f(op) }

// Predicate selects operations. A predicate that keeps state (Randomly) is
// safe for concurrent use.
type Predicate func(op Op) bool

// And selects the operations every p selects (all, for none), asking them
// in order until one says no.
func And(ps ...Predicate) Predicate {
	return func(op Op) bool {
		for _, p := range ps {
			if !p(op) {
				return false
			}
		}
		return true
	}
}

// Or selects the operations some p selects (none, for none), asking them in
// order until one says yes.
func Or(ps ...Predicate) Predicate {
	return func(op Op) bool {
		for _, p := range ps {
			if p(op) {
				return true
			}
		}
		return false
	}
}

// Not selects the operations p does not select.
func Not(p Predicate) Predicate { return func(op Op) bool { return !p(op) } }

// Randomly selects each operation it is asked about with probability p (0
// never, 1 always). It is deterministic: the nth question it is asked gets
// the same answer for the same seed, whatever the operation, so a sequential
// test that fails replays with its seed. Under concurrency the answers are
// the same sequence, handed out in the order the questions arrive.
func Randomly(p float64, seed uint64) Predicate {
	if math.IsNaN(p) || p < 0 || p > 1 {
		panic(fmt.Sprintf("memapi: Randomly: probability %v is not within [0, 1]", p))
	}
	var n atomic.Uint64
	return func(Op) bool {
		// splitmix64 of the question's index: independent of the others,
		// so no lock is needed.
		x := seed + n.Add(1)*0x9e3779b97f4a7c15
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		x ^= x >> 31
		return float64(x>>11)/(1<<53) < p
	}
}

// Rule is an Injector that fails the operations it selects with one error:
// Fail makes one, and On, When and Nth narrow what it selects. Build a rule
// before any layer consults it: the builder methods change the rule in
// place and are not safe to call while it is in use; MaybeError, Fired and
// String are safe for concurrent use.
type Rule struct {
	err   error
	layer string
	names []string
	when  []Predicate
	nth   int64

	selected atomic.Int64 // operations that passed On and When
	fired    atomic.Int64
}

// Fail returns a rule that fails every operation with err (which must not
// be nil), until On, When or Nth narrow it.
func Fail(err error) *Rule {
	if err == nil {
		panic("memapi: Fail(nil)")
	}
	return &Rule{err: err}
}

// On restricts r to the operations of layer ("" for any layer) whose Name is
// one of names (any name, for none).
func (r *Rule) On(layer string, names ...string) *Rule {
	r.layer, r.names = layer, slices.Clone(names)
	return r
}

// When restricts r to the operations p selects; several Whens must all
// select. A nil p is ignored.
func (r *Rule) When(p Predicate) *Rule {
	if p != nil {
		r.when = append(r.when, p)
	}
	return r
}

// Nth restricts r to the nth operation it selects (after On and When),
// counting from 1 from when the rule was made: the rule fires once. 0 means
// every selected operation. It panics for a negative n.
func (r *Rule) Nth(n int) *Rule {
	if n < 0 {
		panic(fmt.Sprintf("memapi: Rule.Nth(%d)", n))
	}
	r.nth = int64(n)
	return r
}

// MaybeError returns r's error when r selects op, and nil otherwise.
func (r *Rule) MaybeError(op Op) error {
	if r.layer != "" && op.Layer != r.layer {
		return nil
	}
	if len(r.names) > 0 && !slices.Contains(r.names, op.Name) {
		return nil
	}
	for _, p := range r.when {
		if !p(op) {
			return nil
		}
	}
	if k := r.selected.Add(1); r.nth != 0 && k != r.nth {
		return nil
	}
	r.fired.Add(1)
	return r.err
}

// Fired reports how many operations r failed.
func (r *Rule) Fired() int { return int(r.fired.Load()) }

// String describes r, as "fail cpu.mmap|munmap #3 when 1: cannot allocate
// memory" (the third operation selected, with one When).
func (r *Rule) String() string {
	var b strings.Builder
	b.WriteString("fail ")
	switch {
	case r.layer == "" && len(r.names) == 0:
		b.WriteString("every operation")
	case r.layer == "":
		b.WriteString("*." + strings.Join(r.names, "|"))
	case len(r.names) == 0:
		b.WriteString(r.layer + ".*")
	default:
		b.WriteString(r.layer + "." + strings.Join(r.names, "|"))
	}
	if r.nth != 0 {
		fmt.Fprintf(&b, " #%d", r.nth)
	}
	if n := len(r.when); n > 0 {
		fmt.Fprintf(&b, " when %d", n)
	}
	b.WriteString(": " + r.err.Error())
	return b.String()
}

// Injected is the error of an operation that an Injector failed with err
// (not nil), for a layer that returns this contract's errors: err itself
// when it is an *Error, otherwise e (the error the layer would report, its
// Op, figures and Detail filled in) with Kind err and ErrInjected as its
// cause. So errors.Is holds for err and for ErrInjected either way.
func Injected(err error, e *Error) error {
	var me *Error
	if errors.As(err, &me) {
		return err
	}
	e.Kind, e.Err = err, ErrInjected
	return e
}

// Any returns an Injector that asks each injector in turn (nil ones are
// skipped) and returns the first error: the later ones are not asked, so
// their counts do not move. With no injector it is nil, which a layer
// treats as no injector at all.
func Any(injectors ...Injector) Injector {
	list := slices.DeleteFunc(slices.Clone(injectors), func(i Injector) bool { return i == nil })
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return anyOf(list)
}

type anyOf []Injector

func (a anyOf) MaybeError(op Op) error {
	for _, i := range a {
		if err := i.MaybeError(op); err != nil {
			return err
		}
	}
	return nil
}

// FaultSet is an Injector whose injectors can be added and cleared while
// layers consult it: a layer that lets a test inject faults as it goes keeps
// one. It asks its injectors in the order they were added, as Any does. The
// zero FaultSet is empty and ready to use; it is safe for concurrent use,
// and asking it takes no lock.
type FaultSet struct {
	mu   sync.Mutex                 // serializes Add and Clear
	list atomic.Pointer[[]Injector] // never changed in place
}

// Add adds i (nil is ignored).
func (s *FaultSet) Add(i Injector) {
	if i == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var list []Injector
	if old := s.list.Load(); old != nil {
		list = slices.Clone(*old)
	}
	list = append(list, i)
	s.list.Store(&list)
}

// Clear removes every injector.
func (s *FaultSet) Clear() {
	s.mu.Lock()
	s.list.Store(nil)
	s.mu.Unlock()
}

// Empty reports whether s has no injector.
func (s *FaultSet) Empty() bool { return s.list.Load() == nil }

// MaybeError asks s's injectors in turn and returns the first error.
func (s *FaultSet) MaybeError(op Op) error {
	list := s.list.Load()
	if list == nil {
		return nil
	}
	return anyOf(*list).MaybeError(op)
}

// Trace is an Injector that fails nothing and records every operation it is
// asked about, in order: put it first in Any to see where the layers can be
// failed and how often, then aim a Rule at one of them. The zero Trace is
// empty and ready to use; it is safe for concurrent use.
type Trace struct {
	mu  sync.Mutex
	ops []Op
}

// MaybeError records op and returns nil.
func (t *Trace) MaybeError(op Op) error {
	t.mu.Lock()
	t.ops = append(t.ops, op)
	t.mu.Unlock()
	return nil
}

// Ops returns the operations recorded, in order.
func (t *Trace) Ops() []Op {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.ops)
}

// Count reports how many operations of layer were recorded whose Name is
// name ("" counts every name).
func (t *Trace) Count(layer, name string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, op := range t.ops {
		if op.Layer == layer && (name == "" || op.Name == name) {
			n++
		}
	}
	return n
}

// Reset forgets every operation recorded.
func (t *Trace) Reset() {
	t.mu.Lock()
	t.ops = nil
	t.mu.Unlock()
}
