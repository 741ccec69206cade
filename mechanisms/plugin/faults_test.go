package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
	"golang.org/x/sys/unix"
)

// The broken plugins of testdata/broken.c, each caught with a named error
// and the ledger exact: what the plugin holds equals what the host accounts
// for (its live handles plus what it quarantined), and through the checked
// wrapper in verify mode, what the grant has drawn.

// recordSuite runs the conformance suite on instances of the plugin at path
// with a recording T, checked against the plugin's own declaration.
func recordSuite(t *testing.T, path string, o Options, wrapped bool) *conformancetest.Results {
	t.Helper()
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler) // the broken plugins' warnings are expected
	}
	d := l.Declaration()
	return conformancetest.Record(func(t conformance.T) conformance.Subject {
		m, err := l.New(o)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c, err := m.NewContext()
		if err != nil {
			t.Fatalf("NewContext: %v", err)
		}
		t.Cleanup(func() {
			_ = c.Close()
			_ = m.Close()
		})
		var mech memapi.Mechanism = m
		if wrapped {
			mech = checked.Wrap(m, conformance.Ledger, checked.WithVerify())
		}
		return conformance.Subject{Mechanism: mech, Context: c, Declared: &d, HostMapped: true}
	})
}

// TestBrokenPluginBaseline: broken.c built without a fault passes the whole
// suite, stress and leak check included, so each fault below is what fails.
func TestBrokenPluginBaseline(t *testing.T) {
	res := recordSuite(t, build(t, "broken"), Options{Verify: true}, true)
	if f := res.Failed(); len(f) > 0 {
		t.Fatalf("the correct build fails %v:\n%s", f, res.Report())
	}
	for _, n := range []string{"concurrency/stress", "leak/freed-range-unmapped", "spec/name", "spec/offers"} {
		if slices.Contains(res.Skipped(), n) {
			t.Errorf("%s was skipped", n)
		}
	}
}

// TestReusedID: a plugin that files a new allocation under the id of a live
// one (and reports that id) has the call refused with ErrProtocol, and the
// host calls no releasing slot: the plugin now holds two objects under one
// id, so a free of that id could free either, the quarantined one included.
// The new object's bytes are quarantined, the live handle whose id was
// reused is quarantined too (never passed to the plugin again), and the
// ledger is exact: the grant keeps exactly what the plugin holds.
func TestReusedID(t *testing.T) {
	m, _ := newSubjectOpts(t, build(t, "broken", "BROKEN_REUSED_ID"), Options{Verify: true})
	w := checked.Wrap(m, countingLedger{}, checked.WithVerify())
	gr := &countingGrant{}
	a1, err := w.Allocate(bg, memapi.AllocRequest{Size: 4096}, gr)
	if err != nil {
		t.Fatal(err)
	}
	frees := 0
	beforeCall = func(fn uintptr) {
		if fn == m.lib.da.Free {
			frees++
		}
	}
	a2, err := w.Allocate(bg, memapi.AllocRequest{Size: 4096}, gr)
	ferr := m.Free(bg, a1, nil)
	beforeCall = nil
	if !errors.Is(err, ErrProtocol) || a2 != nil {
		t.Fatalf("Allocate filed under a live id = %v, %v, want ErrProtocol", a2, err)
	}
	if frees != 0 || !errors.Is(ferr, ErrProtocol) {
		t.Errorf("after the plugin reused live id %d the host called free %d times (Free of that handle = %v); want no call and ErrProtocol: the id names two objects", a1.ID(), frees, ferr)
	}
	if q := m.Quarantined(); q != 8192 {
		t.Errorf("Quarantined = %d, want 8192: the refused allocation and the handle whose id it took", q)
	}
	holds, _ := callInts(m.lib.da.UsedBytes, m.inst)
	if memapi.Bytes(holds) != m.held() || gr.drawn != memapi.Bytes(holds) {
		t.Errorf("the plugin holds %d, the host accounts %d (%d quarantined), the grant drew %d: want all equal", holds, m.held(), m.Quarantined(), gr.drawn)
	}
}

// TestQuarantineCharged: the bytes of an object the host refused and
// quarantined stay charged to the grant of the call that made it, with the
// checked wrapper in verify mode or not: the governor's figure is what the
// plugin holds, never less (the refused allocation is not undrawn) nor more
// (verify mode's settlement does not draw it a second time).
func TestQuarantineCharged(t *testing.T) {
	path := build(t, "broken", "BROKEN_REUSED_ID")
	for _, verify := range []bool{false, true} {
		m, _ := newSubjectOpts(t, path, Options{})
		var opts []checked.Option
		if verify {
			opts = append(opts, checked.WithVerify())
		}
		w := checked.Wrap(m, countingLedger{}, opts...)
		gr := &countingGrant{}
		a1, err := w.Allocate(bg, memapi.AllocRequest{Size: 4096}, gr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Allocate(bg, memapi.AllocRequest{Size: 4096}, gr); !errors.Is(err, ErrProtocol) {
			t.Fatalf("checked verify=%v: Allocate filed under a live id = %v, want ErrProtocol", verify, err)
		}
		holds, _ := callInts(m.lib.da.UsedBytes, m.inst)
		if gr.drawn != memapi.Bytes(holds) {
			t.Errorf("checked verify=%v: the plugin holds %d bytes (%d of them quarantined), the grant drew %d", verify, holds, m.Quarantined(), gr.drawn)
		}
		_ = m.Free(bg, a1, nil) // quarantined: refused; the instance frees it at Close
	}
}

// TestEndedContextCallsNoSlot: a consuming call whose context already ended
// (cancelled, or its deadline past) fails with ErrUnavailable wrapping the
// context's error, and calls no slot: the plugin never receives a deadline
// that has passed.
func TestEndedContextCallsNoSlot(t *testing.T) {
	m, _ := newSubject(t, refhost(t))
	gran := m.Info().Granularity
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 2 * gran})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.CreateBacking(bg, gran, g)
	if err != nil {
		t.Fatal(err)
	}
	v, err := m.MapView(bg, res, memapi.Range{Len: gran}, b, memapi.AccessReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	var made []memapi.Handle // what a call made although it should not have
	defer func() {
		_ = m.UnmapView(bg, v)
		for i := len(made) - 1; i >= 0; i-- {
			switch h := made[i].(type) {
			case *memapi.Allocation:
				_ = m.Free(bg, h, nil)
			case *memapi.Backing:
				_ = m.ReleaseBacking(bg, h, nil)
			case *memapi.View:
				_ = m.UnmapView(bg, h)
			}
		}
		_ = m.ReleaseBacking(bg, b, nil)
		_ = m.Decommit(bg, res, memapi.Range{Off: gran, Len: gran}, nil)
		_ = m.ReleaseReservation(bg, res, nil)
	}()
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	expired, cancel2 := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancel2()
	for name, ctx := range map[string]context.Context{"cancelled": cancelled, "expired": expired} {
		calls := 0
		beforeCall = func(uintptr) { calls++ }
		a, aerr := m.Allocate(ctx, memapi.AllocRequest{Size: 4096}, g)
		cerr := m.Commit(ctx, res, memapi.Range{Off: gran, Len: gran}, g)
		nb, berr := m.CreateBacking(ctx, gran, g)
		nv, werr := m.CopyOnWrite(ctx, v, g)
		beforeCall = nil
		if a != nil {
			made = append(made, a)
		}
		if nb != nil {
			made = append(made, nb)
		}
		if nv != nil {
			v = nv
			made = append(made, nv.Backing())
		}
		for op, err := range map[string]error{"Allocate": aerr, "Commit": cerr, "CreateBacking": berr, "CopyOnWrite": werr} {
			if !errors.Is(err, memapi.ErrUnavailable) || !errors.Is(err, ctx.Err()) {
				t.Errorf("%s under the %s context = %v, want ErrUnavailable wrapping %v", op, name, err, ctx.Err())
			}
		}
		if calls != 0 {
			t.Errorf("%d calls into the plugin under the %s context, want none", calls, name)
		}
	}
}

// TestOffUsedBytes: used_bytes 4 KiB too high is caught in verify mode at
// once (a fresh instance must report 0) with ErrUntruthful; the constant
// offset moves correctly, so the checks of deltas alone never see it.
func TestOffUsedBytes(t *testing.T) {
	path := build(t, "broken", "BROKEN_USED_BYTES")
	_, err := New(path, Options{Verify: true})
	var le *LoadError
	if !errors.Is(err, memapi.ErrUntruthful) || !errors.As(err, &le) {
		t.Fatalf("New in verify mode = %v, want a *LoadError wrapping ErrUntruthful", err)
	}
	m, _ := newSubjectOpts(t, path, Options{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if err != nil {
		t.Fatalf("without verify mode the offset goes unnoticed by the call: %v", err)
	}
	if err := m.audit("test"); !errors.Is(err, memapi.ErrUntruthful) {
		t.Errorf("audit = %v, want ErrUntruthful", err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyAuditsEveryCall: in verify mode every mutating call ends with
// the audit, not only New. An allocation freed behind the host's back makes
// used_bytes 8 KiB lower than the host's table; the next Allocate, whose
// own work succeeds, reports ErrUntruthful.
func TestVerifyAuditsEveryCall(t *testing.T) {
	m, err := New(refhost(t), Options{Verify: true})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 8192}, g)
	if err != nil {
		t.Fatal(err)
	}
	impl, _ := m.issuer.Impl("test", a)
	if r, err := callC(m.lib.da.Free, m.inst, uintptr(entryOf(impl).id)); err != nil || r != 0 {
		t.Fatalf("freeing behind the host's back: %d, %v", r, err)
	}
	b, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	if !errors.Is(err, memapi.ErrUntruthful) {
		t.Errorf("Allocate after the books diverged = %v, want ErrUntruthful from the audit", err)
	}
	if b != nil {
		_ = m.Free(bg, b, nil)
	}
	_ = m.Free(bg, a, nil) // the plugin no longer knows it: quarantined
	if err := m.Close(); err != nil {
		t.Errorf("Close with only a quarantined handle left: %v", err)
	}
}

// TestCallsPerPair: outside verify mode an Allocate and a Free call into the
// plugin twice, allocate and free (no used_bytes, no last_error after a
// success); verify mode adds the used_bytes of each call's audit.
func TestCallsPerPair(t *testing.T) {
	for _, c := range []struct {
		verify bool
		want   []string
	}{
		{false, []string{"allocate", "free"}},
		{true, []string{"allocate", "used_bytes", "free", "used_bytes"}},
	} {
		m, _ := newSubjectOpts(t, refhost(t), Options{Verify: c.verify})
		names := map[uintptr]string{m.lib.da.Allocate: "allocate", m.lib.da.Free: "free", m.lib.da.UsedBytes: "used_bytes"}
		var got []string
		beforeCall = func(fn uintptr) {
			n, ok := names[fn]
			if !ok {
				n = fmt.Sprintf("%#x", fn)
			}
			got = append(got, n)
		}
		a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
		if err == nil {
			err = m.Free(bg, a, nil)
		}
		beforeCall = nil
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("verify=%v: an Allocate and a Free called %v, want %v", c.verify, got, c.want)
		}
	}
}

// TestLeakyFree: a free that reports success and leaves the memory mapped
// keeps every figure right (the plugin reports 0, the host holds 0: the
// leak is physical, not in the books), so only the suite's leak check, which
// looks at the address space, catches it.
func TestLeakyFree(t *testing.T) {
	path := build(t, "broken", "BROKEN_LEAKY_FREE")
	m, _ := newSubjectOpts(t, path, Options{Verify: true})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 8192}, g)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Free(bg, a, nil); err != nil {
		t.Fatalf("Free: %v", err)
	}
	if used := m.UsedBytes(); used != 0 || m.held() != 0 {
		t.Errorf("after the free the plugin reports %d, the host holds %d", used, m.held())
	}
	res := recordSuite(t, path, Options{}, false)
	if o, _ := res.Outcome("leak/freed-range-unmapped"); !o.Failed || !strings.Contains(strings.Join(o.Log, " "), "32 of 32 freed allocations are still mapped") {
		t.Errorf("the suite's leak check = %+v, want it failed", o)
	}
}

// TestOverrunningSlot: an allocate that sleeps past its deadline is given
// back when it returns (a C slot cannot be preempted), and the call fails
// with an *OverrunError (ErrOverran, context.DeadlineExceeded), counted and
// logged; the grant's draw is undone and the plugin holds nothing.
func TestOverrunningSlot(t *testing.T) {
	var logged bytes.Buffer
	o := Options{SlotTimeout: 50 * time.Millisecond, Verify: true, Logger: slog.New(slog.NewTextHandler(&logged, nil))}
	m, _ := newSubjectOpts(t, build(t, "broken", "BROKEN_SLOW_MS=300"), o)
	gr := &countingGrant{}
	w := checked.Wrap(m, countingLedger{}, checked.WithVerify())
	a, err := w.Allocate(bg, memapi.AllocRequest{Size: 4096}, gr)
	var oe *OverrunError
	if a != nil || !errors.Is(err, ErrOverran) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &oe) {
		t.Fatalf("Allocate past its deadline = %v, %v, want an *OverrunError", a, err)
	}
	if oe.Took < 300*time.Millisecond || oe.Budget > 50*time.Millisecond {
		t.Errorf("overrun took %v of a %v budget", oe.Took, oe.Budget)
	}
	if m.Overruns() != 1 || !strings.Contains(logged.String(), "overran its deadline") {
		t.Errorf("Overruns = %d, log %q: want 1 and a line", m.Overruns(), logged.String())
	}
	if used := m.UsedBytes(); used != 0 || gr.drawn != 0 {
		t.Errorf("after the overrun the plugin holds %d and the grant drew %d, want 0 and 0", used, gr.drawn)
	}
	// The context's own deadline, when earlier, is the slot's.
	ctx, cancel := context.WithTimeout(bg, 10*time.Millisecond)
	defer cancel()
	if _, err := m.Allocate(ctx, memapi.AllocRequest{Size: 4096}, g); !errors.As(err, &oe) || oe.Budget > 10*time.Millisecond {
		t.Errorf("Allocate under a 10 ms context = %v, want an overrun of a budget of at most 10ms", err)
	}
}

// TestLocklessTableCaught: a handle table without its lock passes every
// check run one call at a time; the suite's stress fails it, with the host
// naming the ids the plugin lost (ErrProtocol) and keeping their bytes
// quarantined instead of crashing or losing them.
func TestLocklessTableCaught(t *testing.T) {
	res := recordSuite(t, build(t, "broken", "BROKEN_LOCKLESS"), Options{}, false)
	o, _ := res.Outcome("concurrency/stress")
	if !o.Failed {
		t.Fatalf("concurrency/stress passed on a lockless table")
	}
	log := strings.Join(o.Log, "\n")
	if !strings.Contains(log, ErrProtocol.Error()) && !strings.Contains(log, "UsedBytes") {
		t.Errorf("the stress failed without naming a protocol violation or the used bytes:\n%s", log)
	}
	for _, n := range []string{"DeviceAllocator/Allocate/round-trip", "spec/offers"} {
		if slices.Contains(res.Failed(), n) {
			t.Errorf("%s failed: the lockless table should fail only under concurrency", n)
		}
	}
}

// TestConfigAndLastError: open's configuration sets the instance's
// granularity, and a refused configuration fails New with the plugin's own
// message (last_error).
func TestConfigAndLastError(t *testing.T) {
	path := refhost(t)
	m, err := New(path, Options{Config: "granularity=65536"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if g := m.Info().Granularity; g != 65536 {
		t.Fatalf("Info().Granularity = %d with granularity=65536", g)
	}
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 1})
	if err != nil || res.Size() != 65536 {
		t.Fatalf("Reserve(1) = %v, %v: want 64 KiB", res, err)
	}
	if err := m.ReleaseReservation(bg, res, nil); err != nil {
		t.Fatal(err)
	}
	_, err = New(path, Options{Config: "colour=blue"})
	if !errors.Is(err, ErrBadDescriptor) || !errors.Is(err, memapi.ErrUnsupported) || !strings.Contains(err.Error(), "refhost knows one configuration key") {
		t.Errorf("New with an unknown key = %v, want ErrUnsupported with the plugin's message", err)
	}
	if _, err := New(path, Options{Config: "a\x00b"}); !errors.Is(err, ErrBadDescriptor) {
		t.Errorf("New with a NUL in the configuration = %v, want ErrBadDescriptor", err)
	}
	r := recordSuite(t, path, Options{Config: "granularity=65536", Verify: true}, true)
	if f := r.Failed(); len(f) > 0 {
		t.Errorf("the suite at 64 KiB fails %v:\n%s", f, r.Report())
	}
}

// TestHostChecksBeforeSlots: sizes and alignments the header's limits
// exclude never reach the plugin: ErrInvalidSize from the host.
func TestHostChecksBeforeSlots(t *testing.T) {
	// broken.c checks no size itself: what fails is the host's check.
	m, _ := newSubject(t, build(t, "broken"))
	for _, req := range []memapi.AllocRequest{{Size: 0}, {Size: 1<<48 + 1}, {Size: 4096, Align: 3}, {Size: 4096, Align: 1 << 31}} {
		if _, err := m.Allocate(bg, req, g); !errors.Is(err, memapi.ErrInvalidSize) {
			t.Errorf("Allocate(%+v) = %v, want ErrInvalidSize", req, err)
		}
	}
	r, _ := newSubject(t, refhost(t))
	if _, err := r.Reserve(bg, memapi.ReserveRequest{Size: 1<<48 + 1}); !errors.Is(err, memapi.ErrInvalidSize) {
		t.Errorf("Reserve over 2^48 = %v, want ErrInvalidSize", err)
	}
}

// TestDeadlineIsMonotonic: deadline_ns is on CLOCK_MONOTONIC, as the header
// says: a slot comparing it with clock_gettime sees the budget it was given.
func TestDeadlineIsMonotonic(t *testing.T) {
	m := &Mechanism{timeout: time.Second}
	w, err := m.deadline("test", bg)
	if err != nil {
		t.Fatal(err)
	}
	ns := w.ns()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Skip(err)
	}
	if left := time.Duration(ns - uint64(ts.Nano())); left > time.Second+time.Millisecond || left < 900*time.Millisecond {
		t.Errorf("deadline_ns is %v from CLOCK_MONOTONIC's now, want about 1s", left)
	}
}

// TestDeadlineBounds: a context deadline already past, even before the
// process started, gives no window at all (the slot is not called) rather
// than a wrapped deadline_ns; a SlotTimeout near the largest Duration is the
// farthest deadline, not one in the past.
func TestDeadlineBounds(t *testing.T) {
	m := &Mechanism{timeout: time.Second}
	past, cancel := context.WithDeadline(bg, time.Unix(1, 0))
	defer cancel()
	if w, err := m.deadline("test", past); !errors.Is(err, memapi.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a past context deadline gave the window %+v, %v; want ErrUnavailable wrapping DeadlineExceeded", w, err)
	}
	m.timeout = math.MaxInt64
	if w, err := m.deadline("test", bg); err != nil || w.end < w.start || w.passed() || w.ns() < monoBase {
		t.Errorf("a SlotTimeout of the largest Duration gave the window %+v (deadline_ns %d), %v; want the farthest deadline", w, w.ns(), err)
	}
}

// TestDisownedID: an id the host holds live that the plugin answers
// MEMGEN_ERR_RELEASED for (here: freed behind the host's back) is a protocol
// error; the id is quarantined with its bytes, never passed to the plugin
// again, and the instance still closes.
func TestDisownedID(t *testing.T) {
	m, err := New(refhost(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 8192}, g)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := m.issuer.Impl("test", a)
	if r, err := callC(m.lib.da.Free, m.inst, uintptr(entryOf(id).id)); err != nil || r != 0 {
		t.Fatalf("freeing behind the host's back: %d, %v", r, err)
	}
	before := m.ProtocolErrors()
	if err := m.Free(bg, a, nil); !errors.Is(err, ErrProtocol) {
		t.Fatalf("Free of a disowned id = %v, want ErrProtocol", err)
	}
	if q := m.held(); q != 8192 || !a.Live() {
		t.Errorf("after the refused Free the host accounts %d bytes and the handle is live=%v; want 8192, true", q, a.Live())
	}
	calls := 0
	beforeCall = func(uintptr) { calls++ }
	err = m.Free(bg, a, nil)
	beforeCall = nil
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "quarantined") || calls != 0 {
		t.Errorf("second Free = %v after %d calls into the plugin, want ErrProtocol (quarantined) without calling it", err, calls)
	}
	if n := m.ProtocolErrors() - before; n != 2 {
		t.Errorf("ProtocolErrors moved by %d, want 2", n)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close with only a quarantined handle left: %v", err)
	}
}
