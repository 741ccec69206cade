//go:build memgentmpl

// memgen:needs DeviceAllocator DeviceAllocator.Allocate DeviceAllocator.Free DeviceAllocator.UsedBytes DeviceAllocator.Info ErrNoGrant ErrGrantExhausted ErrAuthorityMismatch ErrUnsupported

// Package conformance is the test suite every memgen mechanism must pass,
// generated from spec/capabilities.yaml.
//
// A mechanism package runs it from a test, bare and through the checked
// wrapper:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, func(t *testing.T) conformance.Subject {
//			m := mymech.New()
//			ctx := mymech.NewContext(m)
//			t.Cleanup(func() { ctx.Close(); m.Close() })
//			return conformance.Subject{Mechanism: m, Context: ctx}
//		})
//	}
//
// Every subtest calls the factory for a fresh subject, so subtests never see
// each other's state. The factory registers the subject's cleanup with
// t.Cleanup; the suite's own cleanup runs first: it closes its streams,
// releases every handle the subtest left live (through the creating
// instance), and then fails the subtest when UsedBytes is not back to its
// value at creation or when the ledger does not balance (bytes drawn from the
// suite's grants equal bytes refunded to its accounts).
//
// Subtest names are Capability/Method/case or invariant/id/Method. Most are
// derived from the spec, per method, from its accounting effect and its
// requires clauses: consuming methods get a nil-grant test
// (invariant/charge-before-commit) and an exact-accounting test (UsedBytes
// moves by the amount rounded as declared); refunding methods an exact-refund
// and a nil-account test; releasing methods double-release, concurrent
// release and foreign-handle tests (invariant/release-by-creator); every
// live(x) a nil, released and foreign handle test; within, aligned, positive
// and fits their range, alignment and size errors; optional capabilities an
// absent-means-unsupported test and, when claimed, invariant/no-silent-noop.
// Hand-written scenarios add what the spec's data cannot say: round trips of
// bytes through the device context, fresh backing reading zeros, shared and
// read-only views, copy-on-write, dependants (ErrInUse) and concurrency.
//
// A subtest of an optional capability the subject does not offer is skipped;
// a capability whose accessor reports it offered must work, or the suite
// fails.
//
// Memory is written and read only through the subject's device context
// (Stream.CopyToDevice, CopyFromDevice, Synchronize), so the same suite runs
// on host and device memory. Sizes are small multiples of the mechanism's
// Info().AllocGranularity and Info().Granularity.
//
// The suite runs against anything that implements T, not only *testing.T:
// RunT with a recording T is how the suite's own tests prove that it fails
// the right subtests for deliberately broken mechanisms.
package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// T is the part of *testing.T the suite uses. Fatalf and Skipf must end the
// calling goroutine (runtime.Goexit) as testing.T's do; cleanups run after
// the test function returns, last registered first.
type T interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Failed() bool
	Cleanup(f func())
	// Run runs f as a subtest named name and reports whether it passed.
	Run(name string, f func(t T)) bool
}

// Subject is what a factory returns: a fresh mechanism instance and a device
// context that reads and writes the memory of its handles.
type Subject struct {
	Mechanism memapi.Mechanism
	Context   memapi.DeviceContext
	// Lacks lists the capabilities the spec declares for the mechanism that
	// this subject does not have on this machine, as the factory knows (a
	// GPU without virtual memory management offers DeviceAllocator alone).
	// spec/offers accepts their absence, and only theirs.
	Lacks memapi.CapSet
	// Declared, when set, is what the spec/... subtests check the subject
	// against instead of the spec: the declaration of a plugin
	// (plugin.Library.Declaration) or of a Go mechanism in another module.
	Declared *memapi.MechanismMeta
	// HostMapped says that every allocation is a host mapping of the
	// mechanism's own (a host-memory plugin): leak/freed-range-unmapped
	// checks that a freed range is no longer mapped.
	HostMapped bool
	// OpTimeout, when set, replaces the deadline each call of the suite
	// gets on its own (one minute): for a subject slower than that on
	// purpose, or a test of the suite's timeout report. It bounds one call,
	// never a subtest.
	OpTimeout time.Duration
}

// Factory makes a fresh Subject for one subtest and registers its cleanup
// with t.Cleanup.
type Factory func(t *testing.T) Subject

// FactoryT is Factory for RunT.
type FactoryT func(t T) Subject

// Run runs the suite as subtests of t.
func Run(t *testing.T, f Factory) {
	t.Helper()
	if f == nil {
		t.Fatal("conformance.Run: nil factory")
	}
	RunT(testingT{t}, func(t T) Subject {
		tt, ok := t.(testingT)
		if !ok {
			t.Fatalf("conformance.Run: subtest runs on %T, not *testing.T", t)
		}
		return f(tt.T)
	})
}

// RunT runs the suite as subtests of any T.
func RunT(t T, f FactoryT) {
	t.Helper()
	if f == nil {
		t.Fatalf("conformance.RunT: nil factory")
	}
	runTree(t, f, 0, suite())
}

// Names returns the full names of the suite's subtests (relative to the T
// given to Run), in the order they run.
func Names() []string {
	tests := suite()
	names := make([]string, 0, len(tests))
	for _, tc := range tests {
		names = append(names, tc.name)
	}
	var out []string
	var walk func(depth int, names []string)
	walk = func(depth int, names []string) {
		for _, grp := range groupByLevel(depth, names) {
			for _, n := range grp {
				if strings.Count(n, "/") == depth {
					out = append(out, n)
				}
			}
			var deeper []string
			for _, n := range grp {
				if strings.Count(n, "/") > depth {
					deeper = append(deeper, n)
				}
			}
			walk(depth+1, deeper)
		}
	}
	walk(0, names)
	return out
}

// testingT adapts *testing.T to T.
type testingT struct{ *testing.T }

func (t testingT) Run(name string, f func(t T)) bool {
	return t.T.Run(name, func(st *testing.T) { f(testingT{st}) })
}

// test is one subtest: its full name, the capabilities it needs (it skips
// without them) and its body.
type test struct {
	name  string
	needs memapi.CapSet
	run   func(t T, e *env)
}

// scenarios are the hand-written subtests; each scenario file adds its own
// from an init function.
var scenarios []test

func suite() []test {
	out := make([]test, 0, len(specTests)+len(scenarios))
	out = append(out, specTests...)
	return append(out, scenarios...)
}

// groupByLevel splits names by their element at depth, keeping first-seen order.
func groupByLevel(depth int, names []string) [][]string {
	var order []string
	groups := map[string][]string{}
	for _, n := range names {
		h := strings.Split(n, "/")[depth]
		if _, ok := groups[h]; !ok {
			order = append(order, h)
		}
		groups[h] = append(groups[h], n)
	}
	out := make([][]string, len(order))
	for i, h := range order {
		out[i] = groups[h]
	}
	return out
}

// runTree runs tests as nested subtests, one level per element of their names.
func runTree(t T, f FactoryT, depth int, tests []test) {
	t.Helper()
	byName := map[string]test{}
	names := make([]string, 0, len(tests))
	for _, tc := range tests {
		byName[tc.name] = tc
		names = append(names, tc.name)
	}
	for _, grp := range groupByLevel(depth, names) {
		head := strings.Split(grp[0], "/")[depth]
		t.Run(head, func(t T) {
			var deeper []test
			for _, n := range grp {
				if strings.Count(n, "/") == depth {
					runOne(t, f, byName[n])
				} else {
					deeper = append(deeper, byName[n])
				}
			}
			if len(deeper) > 0 {
				runTree(t, f, depth+1, deeper)
			}
		})
	}
}

func runOne(t T, f FactoryT, tc test) {
	t.Helper()
	e := newEnv(t, f)
	if missing := tc.needs &^ e.caps; missing != 0 {
		t.Skipf("mechanism %s does not offer %s", e.info.Mechanism, missing)
	}
	tc.run(t, e)
}

// opTimeout bounds each call the suite makes with a context, one operation
// at a time (env.op), so a broken mechanism or fence fails the subtest
// instead of hanging it. It bounds progress, never the amount of work: a
// subtest of many calls has no deadline of its own, and the bound is far
// above any call that succeeds on a loaded machine under the race detector.
const opTimeout = time.Minute

// timeout is one operation that ran past opTimeout: what it was, and every
// goroutine's stack when its deadline passed.
type timeout struct {
	op     string
	stacks []byte
}

// op gives one call its own deadline, under parent (the subtest's context,
// or a test's own, cancelled one). If the deadline passes while the call
// runs, every goroutine's stack is taken then, and the subtest reports a
// timeout naming op instead of what the unfinished call left behind. done
// must be called when the call returns.
func (e *env) op(name string, parent context.Context) (ctx context.Context, done func()) {
	ctx, cancel := context.WithTimeout(parent, e.opTimeout)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		if parent.Err() != nil || !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return
		}
		to := timeout{op: name, stacks: allStacks()}
		e.mu.Lock()
		e.timeouts = append(e.timeouts, to)
		e.mu.Unlock()
	})
	return ctx, func() {
		if !stop() {
			<-fired // the report is recorded before the call is done
		}
		cancel()
	}
}

// allStacks returns every goroutine's stack.
func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// env is one subject under test with the suite's ledger and bookkeeping.
type env struct {
	capabilities
	t          T
	factory    FactoryT
	m          memapi.Mechanism
	dc         memapi.DeviceContext
	info       memapi.MechanismInfo
	caps       memapi.CapSet
	lacks      memapi.CapSet         // Subject.Lacks
	declaredBy *memapi.MechanismMeta // Subject.Declared
	hostMapped bool                  // Subject.HostMapped
	ctx        context.Context
	ledger     *ledger
	grant      *grant
	account    *account
	start      memapi.Bytes

	mu        sync.Mutex
	handles   []memapi.Handle // every handle made through the suite, in creation order
	stream    memapi.Stream
	timeouts  []timeout     // the operations that ran past their deadline
	opTimeout time.Duration // each call's deadline: Subject.OpTimeout or opTimeout
}

func newEnv(t T, f FactoryT) *env {
	t.Helper()
	s := f(t)
	if s.Mechanism == nil {
		t.Fatalf("the factory returned no Mechanism")
	}
	if s.Context == nil {
		t.Fatalf("the factory returned no Context")
	}
	// The subtest's context has no deadline: each call gets its own (op).
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, factory: f, m: s.Mechanism, dc: s.Context, lacks: s.Lacks, declaredBy: s.Declared, hostMapped: s.HostMapped, ctx: ctx}
	e.opTimeout = s.OpTimeout
	if e.opTimeout <= 0 {
		e.opTimeout = opTimeout
	}
	e.info = s.Mechanism.Info()
	e.caps = e.capabilities.load(s.Mechanism)
	e.ledger = &ledger{}
	e.grant = e.newGrant(e.info.Authority, unlimited)
	e.account = &account{ledger: e.ledger, authority: e.info.Authority}
	e.start = s.Mechanism.UsedBytes()
	t.Cleanup(func() {
		defer cancel()
		e.finish(t)
	})
	return e
}

// other makes a second, independent subject with the same factory: the
// source of foreign handles.
func (e *env) other(t T) *env {
	t.Helper()
	o := newEnv(t, e.factory)
	if o.info.Instance == e.info.Instance {
		t.Fatalf("the factory returned instance %d twice; every call must make a fresh mechanism instance", o.info.Instance)
	}
	return o
}

// finish closes the suite's stream, releases what the test left live and
// checks that nothing leaked.
func (e *env) finish(t T) {
	t.Helper()
	e.mu.Lock()
	s := e.stream
	e.stream = nil
	e.mu.Unlock()
	if s != nil {
		if err := s.Close(); err != nil && !t.Failed() {
			t.Errorf("closing the suite's stream: %v", err)
		}
	}
	e.sweep(t)
	e.mu.Lock()
	timeouts := e.timeouts
	e.mu.Unlock()
	if len(timeouts) > 0 {
		// What a timed-out call left behind is not a leak: the sweep above
		// said what it could not release, and why.
		for _, to := range timeouts {
			t.Errorf("timeout: %s did not return within %v (a deadline of its own, not the subtest's); goroutines when it expired:\n%s", to.op, e.opTimeout, to.stacks)
		}
		if used := e.m.UsedBytes(); used != e.start {
			t.Logf("after the timeout, UsedBytes is %d (it was %d when the subject was made): what the cleanup above could not release", used, e.start)
		}
		return
	}
	if used := e.m.UsedBytes(); used != e.start {
		t.Errorf("leak: UsedBytes is %d after every handle the subtest made was released; it was %d when the subject was made", used, e.start)
	}
	drawn, refunded, anomalies := e.ledger.totals()
	if drawn != refunded {
		t.Errorf("ledger: %d bytes drawn from the suite's grants (net of undraws) but %d refunded to its accounts after everything was released", drawn, refunded)
	}
	for _, a := range anomalies {
		t.Errorf("ledger: %s", a)
	}
}

// track records a handle made through the suite, after the handles it refers
// to (a view's backing made by CopyOnWrite is the caller's to release).
func (e *env) track(h memapi.Handle) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.trackLocked(h)
}

func (e *env) trackLocked(h memapi.Handle) {
	for _, x := range e.handles {
		if x == h {
			return
		}
	}
	for _, f := range handleFields(h) {
		if f.Creator() == h.Creator() {
			e.trackLocked(f)
		}
	}
	e.handles = append(e.handles, h)
}

func (e *env) tracked() []memapi.Handle {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]memapi.Handle(nil), e.handles...)
}

// sweep releases every tracked live handle, dependants first.
func (e *env) sweep(t T) {
	t.Helper()
	hs := e.tracked()
	for i := len(hs) - 1; i >= 0; i-- {
		if err := e.releaseTree(hs, hs[i]); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
}

// releaseTree releases h after the live handles that depend on it.
func (e *env) releaseTree(all []memapi.Handle, h memapi.Handle) error {
	if !h.Live() {
		return nil
	}
	var errs []error
	for _, d := range all {
		if d != h && d.Live() && dependsOn(d, h) {
			errs = append(errs, e.releaseTree(all, d))
		}
	}
	if err := e.releaseHandle(h); err != nil {
		errs = append(errs, fmt.Errorf("releasing %v: %w", h, err))
	}
	return errors.Join(errs...)
}

// release releases h (and first what depends on it) through the creating
// environment, failing the test when that does not work.
func (e *env) release(t T, h memapi.Handle) {
	t.Helper()
	if err := e.releaseTree(e.tracked(), h); err != nil {
		t.Fatalf("%v", err)
	}
}

// dependsOn reports whether d refers to h (a view to its reservation or backing).
func dependsOn(d, h memapi.Handle) bool {
	for _, f := range handleFields(d) {
		if f == h {
			return true
		}
	}
	return false
}

// unlimited is the capacity of a grant that never runs out.
const unlimited = ^memapi.Bytes(0)

// ledger is the suite's record of what its grants and accounts saw.
type ledger struct {
	mu        sync.Mutex
	drawn     memapi.Bytes // net of undraws, over all grants
	refunded  memapi.Bytes
	anomalies []string
}

func (l *ledger) totals() (drawn, refunded memapi.Bytes, anomalies []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.drawn, l.refunded, append([]string(nil), l.anomalies...)
}

// grant is the suite's minimal memapi.Grant: it checks nothing but its
// capacity and records every draw in the ledger.
type grant struct {
	ledger    *ledger
	authority memapi.AuthorityID
	capacity  memapi.Bytes
	drawn     memapi.Bytes
}

var _ memapi.Grant = (*grant)(nil)

func (e *env) newGrant(a memapi.AuthorityID, capacity memapi.Bytes) *grant {
	return &grant{ledger: e.ledger, authority: a, capacity: capacity}
}

func (g *grant) Authority() memapi.AuthorityID { return g.authority }

func (g *grant) Draw(n memapi.Bytes) error {
	g.ledger.mu.Lock()
	defer g.ledger.mu.Unlock()
	if g.capacity != unlimited && (n > g.capacity || g.drawn > g.capacity-n) {
		return &memapi.Error{Op: "Grant.Draw", Kind: memapi.ErrGrantExhausted, Authority: g.authority, Wanted: n, Available: g.capacity - g.drawn}
	}
	g.drawn += n
	g.ledger.drawn += n
	return nil
}

func (g *grant) Undraw(n memapi.Bytes) error {
	g.ledger.mu.Lock()
	defer g.ledger.mu.Unlock()
	if n > g.drawn {
		g.ledger.anomalies = append(g.ledger.anomalies, fmt.Sprintf("Undraw(%d) of a grant with only %d drawn", n, g.drawn))
		return &memapi.Error{Op: "Grant.Undraw", Kind: memapi.ErrGrantExhausted, Authority: g.authority, Wanted: n, Available: g.drawn}
	}
	g.drawn -= n
	g.ledger.drawn -= n
	return nil
}

// account is the suite's minimal memapi.Account.
type account struct {
	ledger    *ledger
	authority memapi.AuthorityID
}

var _ memapi.Account = (*account)(nil)

func (a *account) Authority() memapi.AuthorityID { return a.authority }

func (a *account) Refund(n memapi.Bytes) error {
	a.ledger.mu.Lock()
	defer a.ledger.mu.Unlock()
	a.ledger.refunded += n
	return nil
}

// Ledger vouches for the grants and accounts the suite makes, and for
// nothing else. A factory that wraps its mechanism in the checked wrapper
// builds it with this ledger, so that the suite's grants are accepted:
//
//	conformance.Subject{Mechanism: checked.Wrap(m, conformance.Ledger), Context: ctx}
var Ledger = suiteLedger{}

// suiteLedger is the type of Ledger.
type suiteLedger struct{}

// IssuedGrant reports whether g is one of the suite's grants, and its
// authority.
func (suiteLedger) IssuedGrant(g memapi.Grant) (memapi.AuthorityID, bool) {
	if x, ok := g.(*grant); ok {
		return x.Authority(), true
	}
	return "", false
}

// IssuedAccount reports whether a is one of the suite's accounts, and its
// authority.
func (suiteLedger) IssuedAccount(a memapi.Account) (memapi.AuthorityID, bool) {
	if x, ok := a.(*account); ok {
		return x.Authority(), true
	}
	return "", false
}

// books is UsedBytes and the ledger at one moment.
type books struct{ used, drawn, refunded memapi.Bytes }

func (e *env) books() books {
	d, r, _ := e.ledger.totals()
	return books{used: e.m.UsedBytes(), drawn: d, refunded: r}
}

// expectConsumed checks that UsedBytes grew by exactly want since before and
// that the ledger saw either nothing (a bare mechanism) or exactly want drawn
// (through the checked wrapper).
func (e *env) expectConsumed(t T, what string, before books, want memapi.Bytes) {
	t.Helper()
	now := e.books()
	if now.used != before.used+want {
		t.Errorf("%s: UsedBytes went from %d to %d, want %d (+%d)", what, before.used, now.used, before.used+want, want)
	}
	if d := now.drawn - before.drawn; d != 0 && d != want {
		t.Errorf("%s: %d bytes drawn from the grant, want %d (or none on a bare mechanism)", what, d, want)
	}
	if now.refunded != before.refunded {
		t.Errorf("%s: %d bytes refunded by a call that refunds nothing", what, now.refunded-before.refunded)
	}
}

// expectRefunded checks that UsedBytes shrank by exactly want since before
// and that the account got either nothing (bare) or exactly want.
func (e *env) expectRefunded(t T, what string, before books, want memapi.Bytes) {
	t.Helper()
	now := e.books()
	if before.used < want || now.used != before.used-want {
		t.Errorf("%s: UsedBytes went from %d to %d, want -%d", what, before.used, now.used, want)
	}
	if r := now.refunded - before.refunded; r != 0 && r != want {
		t.Errorf("%s: %d bytes refunded to the account, want %d (or none on a bare mechanism)", what, r, want)
	}
	if now.drawn != before.drawn {
		t.Errorf("%s: the grant moved by %d bytes during a refunding call", what, int64(now.drawn-before.drawn))
	}
}

// rounding names the unit an accounting amount is rounded to.
type rounding int

const (
	roundNone rounding = iota
	roundAlloc
	roundGranularity
)

// round rounds n up as the spec declares for the method.
func (e *env) round(t T, n memapi.Bytes, r rounding) memapi.Bytes {
	t.Helper()
	var unit memapi.Bytes = 1
	switch r {
	case roundAlloc:
		unit = e.allocGran()
	case roundGranularity:
		unit = e.gran(t)
	}
	up, ok := memapi.RoundUp(n, unit)
	if !ok {
		t.Fatalf("rounding %d up to %d overflows", n, unit)
	}
	return up
}

// allocGran is Info().AllocGranularity, 1 when the mechanism reports 0.
func (e *env) allocGran() memapi.Bytes { return max(1, e.info.AllocGranularity) }

// gran is Info().Granularity, which a mechanism offering ranges must report.
func (e *env) gran(t T) memapi.Bytes {
	t.Helper()
	if e.info.Granularity == 0 {
		t.Fatalf("Info().Granularity is 0 but the subtest needs a granularity (the mechanism offers %s)", e.caps)
	}
	return e.info.Granularity
}

// state is a textual snapshot of everything observable about a subject:
// every query of the spec over every tracked handle, liveness and the ledger.
type state map[string]string

func (e *env) observe(prefix string, s state) {
	hs := e.tracked()
	e.observeQueries(prefix, s, hs)
	for _, h := range hs {
		s[fmt.Sprintf("%slive(%v)", prefix, h)] = fmt.Sprint(h.Live())
	}
	d, r, _ := e.ledger.totals()
	s[prefix+"ledger.drawn"] = fmt.Sprint(d)
	s[prefix+"ledger.refunded"] = fmt.Sprint(r)
}

func observeAll(envs []*env) state {
	s := state{}
	for i, e := range envs {
		prefix := ""
		if i > 0 {
			prefix = fmt.Sprintf("other#%d.", i)
		}
		e.observe(prefix, s)
	}
	return s
}

// diffState reports every difference between two snapshots.
func diffState(t T, what string, before, after state) {
	t.Helper()
	var diffs []string
	for k, v := range before {
		if w, ok := after[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: %s, now gone", k, v))
		} else if w != v {
			diffs = append(diffs, fmt.Sprintf("%s: %s, now %s", k, v, w))
		}
	}
	for k, w := range after {
		if _, ok := before[k]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: new, %s", k, w))
		}
	}
	if len(diffs) > 0 {
		sort.Strings(diffs)
		t.Errorf("%s changed state although it failed:\n\t%s", what, strings.Join(diffs, "\n\t"))
	}
}

// isAny reports whether err matches one of kinds.
func isAny(err error, kinds []error) bool {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return true
		}
	}
	return false
}

func kindList(kinds []error) string {
	s := make([]string, len(kinds))
	for i, k := range kinds {
		s[i] = k.Error()
	}
	return strings.Join(s, " or ")
}

// refuse runs call, which must fail with one of kinds and change nothing
// observable in envs.
func refuse(t T, what string, envs []*env, call func(*env) (memapi.Handle, error), on *env, kinds ...error) {
	t.Helper()
	before := observeAll(envs)
	h, err := call(on)
	switch {
	case err == nil:
		// What a wrongly successful call changed is its success, not a
		// failure's side effect: only the success is reported.
		t.Errorf("%s: succeeded, want %s", what, kindList(kinds))
		return
	case !isAny(err, kinds):
		t.Errorf("%s: got error %q, want %s", what, err, kindList(kinds))
	}
	if h != nil {
		t.Errorf("%s: returned a handle (%v) together with an error", what, h)
	}
	diffState(t, what, before, observeAll(envs))
}

// tolerate runs call, which may succeed (a bare mechanism leaves the ledger
// to the checked wrapper) or fail with kind; a failure must change nothing.
func tolerate(t T, what string, e *env, call func(*env) (memapi.Handle, error), kind error) (succeeded bool) {
	t.Helper()
	before := observeAll([]*env{e})
	_, err := call(e)
	if err == nil {
		return true
	}
	if !errors.Is(err, kind) {
		t.Errorf("%s: got error %q, want success or %s", what, err, kind)
	}
	diffState(t, what, before, observeAll([]*env{e}))
	return false
}

// checkCreated checks a handle a creating call returned.
func checkCreated(t T, e *env, what string, h memapi.Handle) {
	t.Helper()
	switch {
	case h == nil:
		t.Fatalf("%s: succeeded but returned no handle", what)
	case !h.Live():
		t.Errorf("%s: returned a handle that is not live", what)
	case h.Creator() != e.info.Instance:
		t.Errorf("%s: handle records creator %d, the mechanism is instance %d", what, h.Creator(), e.info.Instance)
	case h.ID() == 0:
		t.Errorf("%s: handle has ID 0", what)
	}
	for _, x := range e.tracked() {
		if x != h && x.ID() == h.ID() {
			t.Errorf("%s: handle ID %d is also the ID of %v", what, h.ID(), x)
		}
	}
}

// noSilentNoop fails when a method of a claimed capability reports that it is
// unsupported or fails at all on a valid call.
func noSilentNoop(t T, e *env, capName, method string, err error) {
	t.Helper()
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		t.Errorf("the mechanism claims %s (its accessor returns true) but %s returns %q: an unsupported capability must be absent", capName, method, err)
	case err != nil:
		t.Errorf("%s: valid call failed: %v", method, err)
	}
}

// checkAccessor checks what a mechanism says about an optional capability:
// absent means a nil capability, Require failing with an error that matches
// errors.ErrUnsupported and memapi.ErrUnsupported, and Negotiate leaving it
// out; present means a non-nil capability that Require and Negotiate agree
// on. Either way the answer does not change between calls.
func checkAccessor(t T, capName string, ok, nonNil, stable, required bool, reqErr error, negotiated bool) {
	t.Helper()
	if !stable {
		t.Errorf("As%s answered differently on two calls in a row", capName)
	}
	if ok {
		if !nonNil {
			t.Errorf("As%s returned true with a nil capability", capName)
		}
		if !required || reqErr != nil {
			t.Errorf("As%s returned true but Require%s failed: %v", capName, capName, reqErr)
		}
		if !negotiated {
			t.Errorf("As%s returned true but Negotiate leaves %s out", capName, capName)
		}
		return
	}
	if nonNil {
		t.Errorf("As%s returned false with a non-nil capability", capName)
	}
	if negotiated {
		t.Errorf("As%s returned false but Negotiate includes %s", capName, capName)
	}
	switch {
	case required || reqErr == nil:
		t.Errorf("As%s returned false but Require%s succeeded", capName, capName)
	case !errors.Is(reqErr, errors.ErrUnsupported) || !errors.Is(reqErr, memapi.ErrUnsupported):
		t.Errorf("Require%s of an absent capability returned %q, which does not match errors.ErrUnsupported and memapi.ErrUnsupported", capName, reqErr)
	}
}

// releaseRace runs the same release from several goroutines at once: exactly
// one may succeed, every other must fail with ErrReleased.
func releaseRace(t T, what string, e *env, call func(*env) (memapi.Handle, error)) {
	t.Helper()
	const n = 4
	errs := make([]error, n)
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			_, errs[i] = call(e)
		}()
	}
	start.Done()
	done.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, memapi.ErrReleased):
			t.Errorf("%s: a racing release failed with %q, want %s", what, err, memapi.ErrReleased)
		}
	}
	if ok != 1 {
		t.Errorf("%s: %d of %d racing releases succeeded, want exactly 1", what, ok, n)
	}
}

// sharedStream is the subtest's stream for ordinary copies.
func (e *env) sharedStream(t T) memapi.Stream {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream == nil {
		s, err := e.dc.NewStream()
		if err != nil {
			t.Fatalf("DeviceContext.NewStream: %v", err)
		}
		e.stream = s
	}
	return e.stream
}

// writeOn copies data to addr through s and waits for it.
func (e *env) writeOn(s memapi.Stream, addr memapi.DeviceAddr, data []byte) error {
	if err := s.CopyToDevice(addr, data); err != nil {
		return err
	}
	ctx, done := e.op("Stream.Synchronize", e.ctx)
	defer done()
	return s.Synchronize(ctx)
}

// readOn copies n bytes at addr through s and waits for them.
func (e *env) readOn(s memapi.Stream, addr memapi.DeviceAddr, n memapi.Bytes) ([]byte, error) {
	buf := make([]byte, n)
	if err := s.CopyFromDevice(buf, addr); err != nil {
		return nil, err
	}
	ctx, done := e.op("Stream.Synchronize", e.ctx)
	defer done()
	if err := s.Synchronize(ctx); err != nil {
		return nil, err
	}
	return buf, nil
}

// write writes data at addr through the device context; it must work.
func (e *env) write(t T, what string, addr memapi.DeviceAddr, data []byte) {
	t.Helper()
	if err := e.writeOn(e.sharedStream(t), addr, data); err != nil {
		t.Fatalf("%s: writing %d bytes at %#x through the device context: %v", what, len(data), addr, err)
	}
}

// read reads n bytes at addr through the device context; it must work.
func (e *env) read(t T, what string, addr memapi.DeviceAddr, n memapi.Bytes) []byte {
	t.Helper()
	b, err := e.readOn(e.sharedStream(t), addr, n)
	if err != nil {
		t.Fatalf("%s: reading %d bytes at %#x through the device context: %v", what, n, addr, err)
	}
	return b
}

// witnessed writes a pattern over the n bytes at addr, one granule-sized
// stretch after another, and reads every byte back through the device
// context: the check of no-silent-noop that does not trust the mechanism's
// counters. Memory a call reported installing must hold what is written.
func (e *env) witnessed(t T, what string, addr memapi.DeviceAddr, n memapi.Bytes) {
	t.Helper()
	if n == 0 {
		t.Errorf("%s: reported success with nothing to read back", what)
		return
	}
	data := pattern(n, byte(addr>>12)|1)
	if err := e.writeOn(e.sharedStream(t), addr, data); err != nil {
		t.Errorf("%s reported success, but writing its %d bytes at %#x through the device context fails: %v", what, n, addr, err)
		return
	}
	got, err := e.readOn(e.sharedStream(t), addr, n)
	if err != nil {
		t.Errorf("%s reported success, but reading its %d bytes at %#x back through the device context fails: %v", what, n, addr, err)
		return
	}
	if i := firstDiff(got, data); i >= 0 {
		t.Errorf("%s reported success, but byte %d of %d at %#x reads back %#02x, not the %#02x written: the memory is not installed", what, i, n, addr, got[i], data[i])
	}
}

// expectBytes reads len(want) bytes at addr and compares them.
func (e *env) expectBytes(t T, what string, addr memapi.DeviceAddr, want []byte) {
	t.Helper()
	got := e.read(t, what, addr, memapi.Bytes(len(want)))
	if i := firstDiff(got, want); i >= 0 {
		t.Errorf("%s: byte %d of %d at %#x is %#02x, want %#02x", what, i, len(want), addr, got[i], want[i])
	}
}

// refuseWrite writes data at addr on a fresh stream: the copy must fail with
// one of kinds, and the bytes at addr, if readable, must not change.
func (e *env) refuseWrite(t T, what string, addr memapi.DeviceAddr, data []byte, kinds ...error) {
	t.Helper()
	s, err := e.dc.NewStream()
	if err != nil {
		t.Fatalf("DeviceContext.NewStream: %v", err)
	}
	werr := e.writeOn(s, addr, data)
	if cerr := s.Close(); cerr != nil && (werr == nil || !isAny(cerr, kinds)) {
		t.Errorf("%s: closing the stream after the write: %v", what, cerr)
	}
	switch {
	case werr == nil:
		t.Errorf("%s: writing %d bytes at %#x succeeded, want %s", what, len(data), addr, kindList(kinds))
	case !isAny(werr, kinds):
		t.Errorf("%s: writing at %#x failed with %q, want %s", what, addr, werr, kindList(kinds))
	}
}

// firstDiff returns the index of the first differing byte, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// pattern returns n recognisable bytes, none zero, different per seed. The
// bytes repeat every 251 (a prime, so no granule-sized shift of a pattern
// equals it); the buffer is filled by doubling copies, which stays fast on
// multi-MiB buffers under the race detector.
func pattern(n memapi.Bytes, seed byte) []byte {
	b := make([]byte, n)
	for i := range min(len(b), 251) {
		b[i] = byte((uint64(i)*131+uint64(seed)*17)%251) + 1
	}
	for filled := min(len(b), 251); filled < len(b); filled *= 2 {
		copy(b[filled:], b[:filled])
	}
	return b
}

// allocate allocates size bytes; it must work.
func (e *env) allocate(t T, size memapi.Bytes) *memapi.Allocation {
	t.Helper()
	a, err := (&callAllocate{ctx: e.ctx, req: memapi.AllocRequest{Size: size}, grant: e.grant}).do(e)
	if err != nil {
		t.Fatalf("Allocate(%d): %v", size, err)
	}
	if a == nil {
		t.Fatalf("Allocate(%d) returned no Allocation", size)
	}
	return a
}

// free frees a; it must work.
func (e *env) free(t T, a *memapi.Allocation) {
	t.Helper()
	if _, err := (&callFree{ctx: e.ctx, a: a, to: e.account}).call(e); err != nil {
		t.Fatalf("Free(%v): %v", a, err)
	}
}

// parallel runs n workers and reports every error they return.
func parallel(t T, n int, work func(i int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = work(i)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("worker %d: %v", i, err)
		}
	}
}
