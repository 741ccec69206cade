package conformancetest

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"

	"github.com/memgen/memgen/generated/conformance"
)

// Outcome is how one recorded subtest ended.
type Outcome struct {
	Name    string // full name below the root, e.g. "VirtualBacking/Commit/unaligned"
	Failed  bool
	Skipped bool
	Leaf    bool     // ran no subtests of its own
	Log     []string // Errorf, Fatalf, Skipf and Logf lines, in order
}

// Results are the outcomes of one recorded run.
type Results struct {
	mu       sync.Mutex
	outcomes map[string]*Outcome
	order    []string
	hooks    Hooks
}

// Hooks are told of every subtest as a recorded run goes (RecordWith), for
// a caller that reports progress or must know which subtest is running.
// Either may be nil. Subtests run one at a time, so between a Start and its
// End only that subtest's own subtests start.
type Hooks struct {
	Start func(name string) // the subtest starts
	End   func(o Outcome)   // it ended, its cleanups run
}

// Outcome returns the outcome of the named subtest.
func (r *Results) Outcome(name string) (Outcome, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.outcomes[name]
	if !ok {
		return Outcome{}, false
	}
	return *o, true
}

// Leaves returns the outcomes of the subtests that ran no subtests, in the
// order they finished.
func (r *Results) Leaves() []Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Outcome
	for _, n := range r.order {
		if o := r.outcomes[n]; o.Leaf {
			out = append(out, *o)
		}
	}
	return out
}

// Failed returns the names of the leaf subtests that failed, sorted.
func (r *Results) Failed() []string {
	var out []string
	for _, o := range r.Leaves() {
		if o.Failed {
			out = append(out, o.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Skipped returns the names of the leaf subtests that were skipped, sorted.
func (r *Results) Skipped() []string {
	var out []string
	for _, o := range r.Leaves() {
		if o.Skipped && !o.Failed {
			out = append(out, o.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Report describes the failed leaves with their logs, for a test's message.
func (r *Results) Report() string {
	var b strings.Builder
	for _, n := range r.Failed() {
		o, _ := r.Outcome(n)
		fmt.Fprintf(&b, "--- FAIL: %s\n", n)
		for _, l := range o.Log {
			fmt.Fprintf(&b, "    %s\n", strings.ReplaceAll(l, "\n", "\n    "))
		}
	}
	return b.String()
}

func (r *Results) add(o *Outcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes[o.Name] = o
	r.order = append(r.order, o.Name)
}

// Record runs the conformance suite against f with a recording T and returns
// what happened to every subtest. Nothing is reported to a testing.T, so a
// meta-test can run the suite against a broken mechanism and assert which
// subtests failed.
func Record(f conformance.FactoryT) *Results {
	return RecordWith(f, Hooks{})
}

// RecordWith is Record, telling h of every subtest as it starts and ends.
func RecordWith(f conformance.FactoryT, h Hooks) *Results {
	res := &Results{outcomes: map[string]*Outcome{}, hooks: h}
	root := &recT{res: res}
	root.run(func(t conformance.T) { conformance.RunT(t, f) })
	return res
}

// recT is a conformance.T that records instead of reporting. Like
// testing.T, Fatalf and Skipf end the goroutine of the subtest, every
// subtest runs on its own goroutine, cleanups run after it, last first, and
// a failed subtest fails its parent.
type recT struct {
	res    *Results
	name   string
	parent *recT

	mu       sync.Mutex
	out      Outcome
	kids     int
	cleanups []func()
}

var _ conformance.T = (*recT)(nil)

func (t *recT) Helper()      {}
func (t *recT) Name() string { return t.name }

func (t *recT) logf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out.Log = append(t.out.Log, fmt.Sprintf(format, args...))
}

func (t *recT) Logf(format string, args ...any) { t.logf(format, args...) }

func (t *recT) Errorf(format string, args ...any) {
	t.logf(format, args...)
	t.fail()
}

func (t *recT) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	runtime.Goexit()
}

func (t *recT) Skipf(format string, args ...any) {
	t.logf(format, args...)
	t.mu.Lock()
	t.out.Skipped = true
	t.mu.Unlock()
	runtime.Goexit()
}

func (t *recT) fail() {
	t.mu.Lock()
	t.out.Failed = true
	t.mu.Unlock()
}

func (t *recT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.out.Failed
}

func (t *recT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *recT) Run(name string, f func(t conformance.T)) bool {
	full := name
	if t.name != "" {
		full = t.name + "/" + name
	}
	t.mu.Lock()
	t.kids++
	t.mu.Unlock()
	c := &recT{res: t.res, name: full, parent: t}
	c.run(f)
	if c.Failed() {
		t.fail()
	}
	return !c.Failed()
}

// run runs f on a goroutine of its own, then the cleanups, and records the outcome.
func (t *recT) run(f func(t conformance.T)) {
	if t.name != "" && t.res.hooks.Start != nil {
		t.res.hooks.Start(t.name)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer t.runCleanups()
		defer t.recoverPanic()
		f(t)
	}()
	<-done
	t.mu.Lock()
	o := t.out
	o.Name, o.Leaf = t.name, t.kids == 0
	t.mu.Unlock()
	if t.name != "" {
		t.res.add(&o)
		if t.res.hooks.End != nil {
			t.res.hooks.End(o)
		}
	}
}

func (t *recT) recoverPanic() {
	if p := recover(); p != nil {
		t.Errorf("panic: %v\n%s", p, debug.Stack())
	}
}

// runCleanups runs each cleanup, last registered first, on its own goroutine
// so that a Fatalf in one ends only that one.
func (t *recT) runCleanups() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer t.recoverPanic()
			f()
		}()
		<-done
	}
}
