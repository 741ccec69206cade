package metamorphic

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
)

// stepsPerCheck is the average number of operations in one sequence (rapid's
// -rapid.steps), unless the command line or RAPID_STEPS says otherwise.
const stepsPerCheck = 100

// defaultSteps is how many operations TestMetamorphic runs in all by default
// (half under -short); MEMGEN_METAMORPHIC_STEPS sets another count (make
// metamorphic-long).
const defaultSteps = 10_000

// stepsEnv names the variable that sets the total.
const stepsEnv = "MEMGEN_METAMORPHIC_STEPS"

var bg = context.Background()

// stepsRun counts the random operations run, over every sequence, and
// sequencesRun the sequences (replays while shrinking included).
var stepsRun, sequencesRun atomic.Int64

// TestMain gives rapid this package's average sequence length unless the
// command line or the environment chose one.
func TestMain(m *testing.M) {
	flag.Parse()
	if !flagSet("rapid.steps") && os.Getenv("RAPID_STEPS") == "" {
		_ = flag.Set("rapid.steps", strconv.Itoa(stepsPerCheck))
	}
	os.Exit(m.Run())
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// TestMetamorphic runs random sequences of operations on the fakes, the CPU
// mechanism and the CUDA mechanism over the simulator, and fails at the first
// step where they disagree, printing the seed and the shortest sequence
// rapid finds. It runs sequences until at least defaultSteps operations ran
// (MEMGEN_METAMORPHIC_STEPS sets the count; a fixed -rapid.seed or
// -rapid.checks runs one batch only).
func TestMetamorphic(t *testing.T) {
	want := int64(defaultSteps)
	if testing.Short() {
		want /= 2
	}
	if s := os.Getenv(stepsEnv); s != "" {
		n, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive count", stepsEnv, s)
		}
		want = n
	}
	avg, _ := strconv.Atoi(flag.Lookup("rapid.steps").Value.String())
	if testing.Short() {
		avg /= 2 // as rapid does
	}
	avg = max(avg, 1)
	oneBatch := flagSet("rapid.seed") || flagSet("rapid.checks") || flagSet("rapid.failfile") ||
		os.Getenv("RAPID_SEED") != "" || os.Getenv("RAPID_CHECKS") != ""
	bs, err := newBackends()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capabilities compared (all three offer them): %v", common(bs))
	if err := bs[cudaB].cuda.Close(); err != nil {
		t.Fatal(err)
	}
	start, seqs, began := stepsRun.Load(), sequencesRun.Load(), time.Now()
	for {
		left := want - (stepsRun.Load() - start)
		if !oneBatch {
			n := int(left)/avg + 5
			if testing.Short() {
				n *= 5 // rapid runs a fifth of -rapid.checks under -short
			}
			_ = flag.Set("rapid.checks", strconv.Itoa(n))
		}
		rapid.Check(t, runSequence)
		if t.Failed() || oneBatch || stepsRun.Load()-start >= want {
			break
		}
	}
	ran := stepsRun.Load() - start
	t.Logf("%d operations in %d sequences (%d asked for) in %v",
		ran, sequencesRun.Load()-seqs, want, time.Since(began).Round(time.Millisecond))
	if testing.Verbose() {
		t.Log("outcomes (the fakes'; the CPU mechanism's undone and not run):\n" + tally.String())
	}
}

// tally counts the outcomes of every operation run, per method, over every
// sequence (replays while shrinking included), for -v.
var tally = outcomes{}

type outcomes map[string]map[string]int

func (o outcomes) add(op string, out [nBackends]outcome) {
	method, _, _ := strings.Cut(op, "(")
	if _, m, ok := strings.Cut(method, "= "); ok {
		method = m
	}
	if o[method] == nil {
		o[method] = map[string]int{}
	}
	o[method][kindOf(out[fakeB].err)]++
	if out[cpuB].undone {
		o[method]["cpu undone"]++
	}
	if out[cpuB].skipped {
		o[method]["cpu not run"]++
	}
	if out[fakeB].faulted {
		o[method]["faulted"]++
	}
}

func (o outcomes) String() string {
	var lines []string
	for method, kinds := range o {
		var parts []string
		for k, n := range kinds {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
		slices.Sort(parts)
		lines = append(lines, fmt.Sprintf("  %-20s %s", method, strings.Join(parts, ", ")))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// common returns the capabilities all three offer: the operations of the
// others are not drawn. On Linux with memfd_create it is every capability.
func common(bs [nBackends]*backend) memapi.CapSet {
	caps := memapi.Of(memapi.Capabilities...)
	for _, b := range bs {
		caps &= memapi.Negotiate(b.m)
	}
	return caps
}

// runSequence is one rapid check: three fresh backends, a random sequence of
// operations, then everything released.
func runSequence(t *rapid.T) {
	sequencesRun.Add(1)
	bs, err := newBackends()
	w := &world{t: t, b: bs}
	defer w.teardown()
	if err != nil {
		t.Fatal(err)
	}
	w.caps = common(bs)
	// One action draws the operation by name from a list weighted towards
	// the operations that make state for the others to work on.
	type action struct {
		name   string
		weight int
		run    func(*rapid.T)
	}
	list := []action{{"Allocate", 10, w.allocate}, {"Free", 6, w.free}}
	if w.caps.Has(memapi.CapVirtualBacking) {
		list = append(list,
			action{"Reserve", 10, w.reserve},
			action{"Commit", 14, w.commit},
			action{"Decommit", 9, w.decommit},
			action{"ReleaseReservation", 3, w.releaseReservation},
			action{"CommittedBytes", 2, w.committedBytes})
	}
	if w.caps.Has(memapi.CapVirtualBacking) && w.caps.Has(memapi.CapSharedMapping) {
		list = append(list,
			action{"CreateBacking", 10, w.createBacking},
			action{"MapView", 14, w.mapView},
			action{"UnmapView", 5, w.unmapView},
			action{"CopyOnWrite", 5, w.copyOnWrite},
			action{"ReleaseBacking", 3, w.releaseBacking},
			action{"ViewCount", 2, w.viewCount})
	}
	var names []string
	runs := map[string]func(*rapid.T){}
	for _, a := range list {
		for range a.weight {
			names = append(names, a.name)
		}
		runs[a.name] = a.run
	}
	opName := uniform(names)
	t.Repeat(map[string]func(*rapid.T){
		"op": func(t *rapid.T) {
			stepsRun.Add(1)
			runs[opName.Draw(t, "op")](t)
		},
		"": func(*rapid.T) { w.checkFigures() },
	})
	w.releaseAll()
	w.checkEmpty()
}

// object is one logical handle: the handle each backend made for the same
// operation, and whether the sequence released it.
type object[H memapi.Handle] struct {
	name string // a3, r1, b2, v4: its kind and the step that made it
	h    [nBackends]H
	live bool

	// A reservation's granules as the sequence left them ('.' no backing,
	// 'c' committed, 'v' under a view), to draw ranges that mean
	// something: only the generator reads it, never a check.
	slots []byte
	// A view's reservation and range.
	in *object[*memapi.Reservation]
	at memapi.Range
}

// mark sets the granules of rg in o to state.
func (o *object[H]) mark(rg memapi.Range, state byte) {
	for i := rg.Off / gran; i < (rg.Off+rg.Len)/gran; i++ {
		o.slots[i] = state
	}
}

// ref is the handle an operation names: a live or released object, the same
// object as another backend made it (a foreign handle: backend i gets backend
// i+1's), or nil.
type ref[H memapi.Handle] struct {
	desc    string
	obj     *object[H]
	foreign bool
}

// at returns the handle backend i is given.
func (r ref[H]) at(i int) H {
	var zero H
	switch {
	case r.obj == nil:
		return zero
	case r.foreign:
		return r.obj.h[(i+1)%nBackends]
	}
	return r.obj.h[i]
}

// own reports whether the handle is the backend's own, live or released.
func (r ref[H]) own() bool { return r.obj != nil && !r.foreign }

// live reports whether the handle is the backend's own and live.
func (r ref[H]) live() bool { return r.own() && r.obj.live }

// world is one sequence: the three backends and the logical handles.
type world struct {
	t      *rapid.T
	b      [nBackends]*backend
	caps   memapi.CapSet
	step   int
	allocs []*object[*memapi.Allocation]
	ress   []*object[*memapi.Reservation]
	backs  []*object[*memapi.Backing]
	views  []*object[*memapi.View]
	done   bool // released everything and checked
}

func (w *world) name(kind string) string { return fmt.Sprintf("%s%d", kind, w.step+1) }

// fault is a failure of the device injected at the same logical point in
// the three, the same rule of the contract's fault injector each time
// (memapi.Fail(memapi.ErrOutOfMemory)): in the fakes on the method, in the
// simulator on the nth call of a driver entry point in the operation (which
// then returns CUDA_ERROR_OUT_OF_MEMORY), and in the CPU mechanism on the
// first of its kernel calls named cpu (which fails as if with ENOMEM).
type fault struct {
	method string // the fakes' method
	call   string // the simulator's entry point
	nth    int
	cpu    string // the CPU mechanism's kernel call
}

func (f *fault) String() string {
	return fmt.Sprintf(" [device refuses: %s call %d, %s, of the operation]", f.call, f.nth, f.cpu)
}

// op is one operation, run the same way on each backend.
type op struct {
	name string
	// consumes is what the operation takes from the device if it succeeds
	// (rounded as the spec rounds it), for the capacity the CPU lacks.
	consumes memapi.Bytes
	fault    *fault
	// huge: the size is beyond every mechanism; the contract allows
	// ErrInvalidSize or ErrOutOfMemory, and each backend may answer either.
	huge bool
	// irreversible: the operation has no inverse (CopyOnWrite releases the
	// view it copies); expectOK says whether it should succeed.
	irreversible, expectOK bool
	run                    func(i int) (any, error)
	// undo reverses a success on backend i, refunding to its grant, for the
	// CPU mechanism where the others ran out of memory.
	undo func(i int, made any) error
}

type outcome struct {
	made    any
	err     error
	skipped bool // not run on this backend (see apply)
	undone  bool // succeeded, then undone (see apply)
	faulted bool // the device refused on purpose (see apply)
}

func (o outcome) String() string {
	switch {
	case o.skipped:
		return "not run"
	case o.undone:
		return "ok (undone: no capacity)"
	}
	return kindOf(o.err)
}

// kinds are the contract's error kinds, compared with errors.Is.
var kinds = []struct {
	name string
	err  error
}{
	{"ErrUnsupported", memapi.ErrUnsupported},
	{"ErrUnavailable", memapi.ErrUnavailable},
	{"ErrOutOfMemory", memapi.ErrOutOfMemory},
	{"ErrInvalidSize", memapi.ErrInvalidSize},
	{"ErrInvalidRange", memapi.ErrInvalidRange},
	{"ErrUnaligned", memapi.ErrUnaligned},
	{"ErrNilHandle", memapi.ErrNilHandle},
	{"ErrForeignHandle", memapi.ErrForeignHandle},
	{"ErrReleased", memapi.ErrReleased},
	{"ErrInUse", memapi.ErrInUse},
	{"ErrCommitted", memapi.ErrCommitted},
	{"ErrNotCommitted", memapi.ErrNotCommitted},
	{"ErrReadOnly", memapi.ErrReadOnly},
	{"ErrNoGrant", memapi.ErrNoGrant},
	{"ErrNoAccount", memapi.ErrNoAccount},
	{"ErrForeignGrant", memapi.ErrForeignGrant},
	{"ErrGrantClosed", memapi.ErrGrantClosed},
	{"ErrGrantExhausted", memapi.ErrGrantExhausted},
	{"ErrAuthorityMismatch", memapi.ErrAuthorityMismatch},
	{"ErrOverBudget", memapi.ErrOverBudget},
	{"ErrUntruthful", memapi.ErrUntruthful},
	{"ErrClosed", memapi.ErrClosed},
}

// kindOf names the kinds err matches ("ok" for nil): the kind is compared,
// never the message.
func kindOf(err error) string {
	if err == nil {
		return "ok"
	}
	var names []string
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			names = append(names, k.name)
		}
	}
	if len(names) == 0 {
		return "no kind (" + err.Error() + ")"
	}
	return strings.Join(names, "+")
}

// apply runs o on the three backends and fails the sequence unless they
// agree. It returns what each made.
//
// The CPU mechanism has no capacity, so it runs first: where it succeeds
// and the others answer ErrOutOfMemory because the operation does not fit
// the capacity, its success is undone (refunded to the grant it drew from),
// which leaves it as the others are; an operation without an inverse
// (CopyOnWrite) that should succeed but does not fit is not run on it at
// all. A fault is injected only where the operation fits, first into the
// CPU mechanism, and into the others only where it fired there: where the
// operation passed every check and reached the kernel, as it would reach
// the device.
func (w *world) apply(o *op) [nBackends]outcome {
	t := w.t
	w.step++
	var out [nBackends]outcome
	run := func(i int) {
		out[i].made, out[i].err = o.run(i)
	}
	used := w.b[fakeB].m.UsedBytes()
	over := o.consumes > 0 && used+o.consumes > capacity
	f := o.fault
	if over {
		f = nil
	}
	armed := false
	if o.irreversible && o.expectOK && over {
		out[cpuB].skipped = true
	} else {
		var rule *memapi.Rule
		if f != nil {
			rule = memapi.Fail(memapi.ErrOutOfMemory).On(cpu.Layer, f.cpu).Nth(1)
			w.b[cpuB].faults.Add(rule)
		}
		run(cpuB)
		if f != nil {
			w.b[cpuB].faults.Clear()
			armed = rule.Fired() == 1
		}
	}
	var before int
	if armed {
		w.b[fakeB].fake.InjectWith(memapi.Fail(memapi.ErrOutOfMemory).On(fakes.Layer, f.method))
		before = w.b[cudaB].sim.Calls(f.call)
		w.b[cudaB].sim.Inject(memapi.Fail(memapi.ErrOutOfMemory).On(cudasim.Layer, f.call).Nth(f.nth))
	}
	run(fakeB)
	run(cudaB)
	desc := o.name
	if armed {
		desc += f.String()
		w.b[fakeB].fake.ClearFaults()
		w.b[cudaB].sim.ClearFaults()
		out[fakeB].faulted, out[cpuB].faulted, out[cudaB].faulted = true, true, true
	}
	line := func() string {
		return fmt.Sprintf("#%d %s → fakes %v, cpu %v, cuda %v", w.step, desc, out[fakeB], out[cpuB], out[cudaB])
	}
	if armed {
		if n := w.b[cudaB].sim.Calls(f.call) - before; n < f.nth {
			t.Fatalf("%s: the simulator's fault was not reached (%d calls of %s)", line(), n, f.call)
		}
	}
	kf, kc, kp := kindOf(out[fakeB].err), kindOf(out[cudaB].err), kindOf(out[cpuB].err)
	if o.huge {
		for i := range nBackends {
			if k := kindOf(out[i].err); !out[i].skipped && k != "ErrInvalidSize" && k != "ErrOutOfMemory" {
				t.Fatalf("%s: %s answered %s for a huge size, want ErrInvalidSize or ErrOutOfMemory", line(), backendNames[i], k)
			}
		}
		t.Log(line())
		tally.add(o.name, out)
		return out
	}
	if kf != kc {
		t.Fatalf("%s: the fakes and the CUDA mechanism disagree", line())
	}
	if (over || armed) && kf == "ok" {
		t.Fatalf("%s: succeeded where the device had no room (%d used, %d more, capacity %d) or refused", line(), used, o.consumes, capacity)
	}
	switch {
	case out[cpuB].skipped:
		if kf != "ErrOutOfMemory" {
			t.Fatalf("%s: want ErrOutOfMemory (%d used, %d more, capacity %d)", line(), used, o.consumes, capacity)
		}
	case kp == kf:
	case kp == "ok" && kf == "ErrOutOfMemory" && over && o.undo != nil:
		if err := o.undo(cpuB, out[cpuB].made); err != nil {
			t.Fatalf("%s: undoing the CPU mechanism's success: %v", line(), err)
		}
		out[cpuB].undone = true
	case kp == "ok" && kf == "ErrOutOfMemory":
		t.Fatalf("%s: out of memory with room left and no fault (%d used, %d more, capacity %d)", line(), used, o.consumes, capacity)
	default:
		t.Fatalf("%s: the CPU mechanism disagrees", line())
	}
	t.Log(line())
	tally.add(o.name, out)
	return out
}

// ok reports whether the operation succeeded (everywhere, since apply
// checked that the backends agree).
func ok(out [nBackends]outcome) bool { return out[fakeB].err == nil }
