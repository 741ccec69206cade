//go:build memgentmpl

package memapi

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// A layer asks its injector before each operation that can fail, and
// reports an injected error as the failure it stands for.
func ExampleFail() {
	inj := Any(
		Fail(ErrOutOfMemory).On("pool", "grow").Nth(2), // the second grow
	)
	grow := func(n Bytes) error {
		if inj != nil { // a layer without an injector pays this check only
			if err := inj.MaybeError(Op{Layer: "pool", Name: "grow", Bytes: n}); err != nil {
				return &Error{Op: "pool.grow", Kind: err, Wanted: n, Err: ErrInjected}
			}
		}
		return nil // grown
	}
	for i := 1; i <= 3; i++ {
		err := grow(Bytes(i) << 20)
		fmt.Println(i, err, errors.Is(err, ErrOutOfMemory), errors.Is(err, ErrInjected))
	}
	// Output:
	// 1 <nil> false false
	// 2 pool.grow: out of memory (wanted 2097152, available 0): memapi: injected fault true true
	// 3 <nil> false false
}

// A Trace shows where the layers can be failed; a rule then aims at one.
func ExampleTrace() {
	var trace Trace
	rule := Fail(ErrOutOfMemory).On("cpu", "mmap").When(func(op Op) bool { return op.Bytes > 1<<20 })
	inj := Any(&trace, rule)
	for _, op := range []Op{
		{Layer: "cpu", Name: "mmap", Bytes: 4096},
		{Layer: "cpu", Name: "mprotect", Bytes: 2 << 20},
		{Layer: "cpu", Name: "mmap", Bytes: 2 << 20},
	} {
		fmt.Println(op, op.Bytes, inj.MaybeError(op))
	}
	fmt.Println(trace.Count("cpu", "mmap"), "mmaps;", rule)
	// Output:
	// cpu.mmap 4096 <nil>
	// cpu.mprotect 2097152 <nil>
	// cpu.mmap 2097152 memapi: out of memory
	// 2 mmaps; fail cpu.mmap when 1: memapi: out of memory
}

var errTest = errors.New("test fault")

func TestInjectorRule(t *testing.T) {
	for _, c := range []struct {
		name string
		rule *Rule
		op   Op
		want bool
	}{
		{"every", Fail(errTest), Op{Layer: "a", Name: "x"}, true},
		{"layer", Fail(errTest).On("a"), Op{Layer: "a", Name: "x"}, true},
		{"other layer", Fail(errTest).On("b"), Op{Layer: "a", Name: "x"}, false},
		{"name", Fail(errTest).On("a", "y", "x"), Op{Layer: "a", Name: "x"}, true},
		{"other name", Fail(errTest).On("a", "y"), Op{Layer: "a", Name: "x"}, false},
		{"any layer, name", Fail(errTest).On("", "x"), Op{Layer: "b", Name: "x"}, true},
		{"when", Fail(errTest).When(func(op Op) bool { return op.Bytes > 10 }), Op{Bytes: 11}, true},
		{"when not", Fail(errTest).When(func(op Op) bool { return op.Bytes > 10 }), Op{Bytes: 10}, false},
		{"two whens", Fail(errTest).When(func(Op) bool { return true }).When(func(Op) bool { return false }), Op{}, false},
		{"nil when", Fail(errTest).When(nil), Op{}, true},
	} {
		err := c.rule.MaybeError(c.op)
		if got := err != nil; got != c.want {
			t.Errorf("%s: %v on %v failed %v, want %v", c.name, c.rule, c.op, got, c.want)
		}
		if err != nil && err != errTest {
			t.Errorf("%s: error %v, want the rule's own", c.name, err)
		}
		if want := map[bool]int{true: 1}[c.want]; c.rule.Fired() != want {
			t.Errorf("%s: Fired %d, want %d", c.name, c.rule.Fired(), want)
		}
	}
}

// Nth counts only the operations that On and When selected, and fires once.
func TestInjectorNth(t *testing.T) {
	r := Fail(errTest).On("a", "x").When(func(op Op) bool { return op.Bytes%2 == 0 }).Nth(3)
	var failed []int
	for i := range 20 {
		for _, op := range []Op{{Layer: "a", Name: "y"}, {Layer: "b", Name: "x"}, {Layer: "a", Name: "x", Bytes: Bytes(i)}} {
			if r.MaybeError(op) != nil {
				failed = append(failed, i)
			}
		}
	}
	if !slices.Equal(failed, []int{4}) || r.Fired() != 1 { // 0, 2, then 4
		t.Fatalf("failed at %v (%d fired), want [4]", failed, r.Fired())
	}
}

func TestInjectorPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Fail(nil)":      func() { Fail(nil) },
		"Nth(-1)":        func() { Fail(errTest).Nth(-1) },
		"Randomly(-0.1)": func() { Randomly(-0.1, 1) },
		"Randomly(1.5)":  func() { Randomly(1.5, 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}

// Any returns the first error; the injectors after it are not asked.
func TestInjectorAny(t *testing.T) {
	if Any() != nil || Any(nil, nil) != nil {
		t.Fatal("Any of no injector is not nil")
	}
	r := Fail(errTest)
	if Any(nil, r) != Injector(r) {
		t.Fatal("Any of one injector is not that injector")
	}
	errOther := errors.New("other")
	first, second := Fail(errTest).On("a"), Fail(errOther)
	inj := Any(first, nil, second)
	if err := inj.MaybeError(Op{Layer: "a"}); err != errTest {
		t.Fatalf("got %v, want the first rule's error", err)
	}
	if err := inj.MaybeError(Op{Layer: "b"}); err != errOther {
		t.Fatalf("got %v, want the second rule's error", err)
	}
	if first.Fired() != 1 || second.Fired() != 1 {
		t.Fatalf("fired %d and %d, want 1 and 1 (the second was asked once)", first.Fired(), second.Fired())
	}
}

func TestInjectorPredicates(t *testing.T) {
	yes := func(Op) bool { return true }
	no := func(Op) bool { return false }
	for _, c := range []struct {
		name string
		p    Predicate
		want bool
	}{
		{"And()", And(), true},
		{"And(yes, yes)", And(yes, yes), true},
		{"And(yes, no)", And(yes, no), false},
		{"Or()", Or(), false},
		{"Or(no, yes)", Or(no, yes), true},
		{"Or(no, no)", Or(no, no), false},
		{"Not(no)", Not(no), true},
		{"Not(yes)", Not(yes), false},
		{"Randomly(0)", Randomly(0, 1), false},
		{"Randomly(1)", Randomly(1, 1), true},
	} {
		if got := c.p(Op{}); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
}

// Randomly gives the same answers for the same seed, others for another
// seed, in about the proportion asked.
func TestInjectorRandomly(t *testing.T) {
	draw := func(seed uint64) []bool {
		p := Randomly(0.25, seed)
		out := make([]bool, 4000)
		for i := range out {
			out[i] = p(Op{Name: fmt.Sprint(i)})
		}
		return out
	}
	a, b, c := draw(7), draw(7), draw(8)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave other answers")
	}
	if slices.Equal(a, c) {
		t.Fatal("another seed gave the same answers")
	}
	n := 0
	for _, v := range a {
		if v {
			n++
		}
	}
	if n < 850 || n > 1150 {
		t.Fatalf("%d of 4000 selected with p = 0.25", n)
	}
}

// Concurrent askers: Nth fires exactly once, counts are exact, and a
// FaultSet can change while it is asked (run with -race).
func TestInjectorConcurrent(t *testing.T) {
	const workers, each = 8, 500
	nth := Fail(errTest).On("a").Nth(workers * each / 2)
	every := Fail(errTest).On("b")
	random := Randomly(0.5, 3)
	var set FaultSet
	var trace Trace
	set.Add(&trace)
	set.Add(nth)
	set.Add(every)
	var wg sync.WaitGroup
	var mu sync.Mutex
	failedA, picked := 0, 0
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if set.MaybeError(Op{Layer: "a", Call: i}) != nil {
					mu.Lock()
					failedA++
					mu.Unlock()
				}
				_ = set.MaybeError(Op{Layer: "b"})
				if random(Op{}) {
					mu.Lock()
					picked++
					mu.Unlock()
				}
				if w == 0 && i%100 == 0 {
					set.Add(InjectorFunc(func(Op) error { return nil }))
				}
			}
		}()
	}
	wg.Wait()
	if failedA != 1 || nth.Fired() != 1 {
		t.Fatalf("Nth failed %d operations (Fired %d), want exactly 1", failedA, nth.Fired())
	}
	if every.Fired() != workers*each {
		t.Fatalf("every fired %d times, want %d", every.Fired(), workers*each)
	}
	if got := trace.Count("a", ""); got != workers*each {
		t.Fatalf("the trace saw %d operations of a, want %d", got, workers*each)
	}
	// The same seed asked as often sequentially selects as many.
	seq, want := Randomly(0.5, 3), 0
	for range workers * each {
		if seq(Op{}) {
			want++
		}
	}
	if picked != want {
		t.Fatalf("Randomly picked %d concurrently, %d sequentially", picked, want)
	}
}

func TestInjectorFaultSet(t *testing.T) {
	var s FaultSet
	if !s.Empty() || s.MaybeError(Op{}) != nil {
		t.Fatal("the zero FaultSet is not empty")
	}
	s.Add(nil)
	if !s.Empty() {
		t.Fatal("Add(nil) added an injector")
	}
	r := Fail(errTest).Nth(2)
	s.Add(r)
	if s.Empty() || s.MaybeError(Op{}) != nil || s.MaybeError(Op{}) != errTest || s.MaybeError(Op{}) != nil {
		t.Fatal("the set does not ask its rule")
	}
	s.Clear()
	if !s.Empty() || s.MaybeError(Op{}) != nil {
		t.Fatal("Clear left an injector")
	}
}

func TestInjectorTrace(t *testing.T) {
	var tr Trace
	ops := []Op{{Layer: "a", Name: "x"}, {Layer: "a", Name: "y"}, {Layer: "b", Name: "x"}}
	for _, op := range ops {
		if tr.MaybeError(op) != nil {
			t.Fatal("a Trace failed an operation")
		}
	}
	if !slices.Equal(tr.Ops(), ops) {
		t.Fatalf("Ops = %v, want %v", tr.Ops(), ops)
	}
	if tr.Count("a", "") != 2 || tr.Count("a", "x") != 1 || tr.Count("c", "") != 0 {
		t.Fatal("Count miscounts")
	}
	tr.Reset()
	if len(tr.Ops()) != 0 {
		t.Fatal("Reset kept operations")
	}
}

func TestInjectorString(t *testing.T) {
	for _, c := range []struct {
		r    *Rule
		want string
	}{
		{Fail(errTest), "fail every operation: test fault"},
		{Fail(errTest).On("cpu"), "fail cpu.*: test fault"},
		{Fail(errTest).On("", "mmap"), "fail *.mmap: test fault"},
		{Fail(errTest).On("cpu", "mmap", "munmap").Nth(3).When(func(Op) bool { return true }), "fail cpu.mmap|munmap #3 when 1: test fault"},
	} {
		if got := c.r.String(); got != c.want {
			t.Errorf("String() = %q, want %q", got, c.want)
		}
	}
	if got := (Op{Layer: "cpu", Name: "mmap"}).String(); got != "cpu.mmap" {
		t.Errorf("Op.String() = %q", got)
	}
}
