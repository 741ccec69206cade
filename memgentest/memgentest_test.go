package memgentest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/memgentest"
)

// recTB is a testing.TB whose failures and cleanups the test sees: the
// harness reports into it, and run plays its cleanups as the end of a test
// would.
type recTB struct {
	testing.TB
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recTB) Helper() {}

func (r *recTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recTB) Fatalf(format string, args ...any) {
	r.TB.Helper()
	r.TB.Fatalf("the harness failed to set up: "+format, args...)
}

func (r *recTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// run plays the cleanups, last first, and reports how long they took.
func (r *recTB) run() time.Duration {
	start := time.Now()
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
	return time.Since(start)
}

func (r *recTB) failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.errs...)
}

func mechanisms() map[string]memgentest.Options {
	return map[string]memgentest.Options{"fake": {}, "cpu": {CPU: true, Granularity: 64 << 10}}
}

// Code that closes what it allocates passes: nothing reported, the ledger
// and the mechanism back to zero.
func TestCleanCodePasses(t *testing.T) {
	for name, opts := range mechanisms() {
		t.Run(name, func(t *testing.T) {
			rec := &recTB{TB: t}
			h := memgentest.New(rec, opts)
			b := h.Bind("kv", "cache")
			buf, err := b.Allocate(context.Background(), 10_000)
			if err != nil {
				t.Fatal(err)
			}
			if s := h.Snapshot(); s.Charged == 0 {
				t.Fatalf("nothing charged: %+v", s)
			}
			if err := buf.Close(); err != nil {
				t.Fatal(err)
			}
			rec.run()
			if f := rec.failures(); len(f) != 0 {
				t.Fatalf("clean code reported: %q", f)
			}
			if s := h.Snapshot(); s.Charged != 0 || s.Reserved != 0 || s.Pending != 0 {
				t.Fatalf("ledger after cleanup: %+v", s)
			}
		})
	}
}

// A buffer and a region the code never closed fail the test, each named,
// and cleanup gives their memory back without waiting for the bound.
func TestLeaksFailTheTestByName(t *testing.T) {
	for name, opts := range mechanisms() {
		t.Run(name, func(t *testing.T) {
			rec := &recTB{TB: t}
			opts.Drain = time.Hour // a cleanup that waited for it would meet the watchdog
			h := memgentest.New(rec, opts)
			b := h.Bind("kv", "cache")
			buf, err := b.Allocate(context.Background(), 10_000)
			if err != nil {
				t.Fatal(err)
			}
			_, _, bufLine, _ := runtime.Caller(0)
			r, err := b.ReserveVirtual(context.Background(), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			_, _, regionLine, _ := runtime.Caller(0)
			watchdog.Within(t, watchdog.Bound, "the cleanup, whose drain bound is an hour", func() { rec.run() })
			f := rec.failures()
			if len(f) != 2 {
				t.Fatalf("%d failures, want the buffer's and the region's: %q", len(f), f)
			}
			all := strings.Join(f, "\n")
			// Each names its size and the line that made it (3 lines above
			// each runtime.Caller).
			for _, want := range []string{fmt.Sprintf("leaked kv/cache buffer %#x", buf.Addr()), fmt.Sprintf("%#x", r.Addr()), "never closed",
				fmt.Sprintf("%d bytes, made at memgentest_test.go:%d (", buf.Size(), bufLine-4),
				fmt.Sprintf("%d bytes, made at memgentest_test.go:%d (", r.Cap(), regionLine-4)} {
				if !strings.Contains(all, want) {
					t.Errorf("failures %q do not say %q", f, want)
				}
			}
			if s := h.Snapshot(); s.Charged != 0 || s.Reserved != 0 {
				t.Errorf("the leaks' memory was not given back: %+v", s)
			}
			if h.Fake != nil && h.Fake.UsedBytes() != 0 {
				t.Errorf("the fake still holds %d bytes", h.Fake.UsedBytes())
			}
		})
	}
}

// A handle whose release failed is reported as quarantined, with its error.
func TestQuarantinedHandleFailsTheTest(t *testing.T) {
	rec := &recTB{TB: t}
	h := memgentest.New(rec, memgentest.Options{})
	b := h.Bind("weights", "model")
	buf, err := b.Allocate(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	h.Fake.Inject(fakes.Fault{Method: "Free", Err: errors.New("device lost")})
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	rec.run()
	f := rec.failures()
	if len(f) != 1 || !strings.Contains(f[0], fmt.Sprintf("quarantined weights/model buffer %#x", buf.Addr())) || !strings.Contains(f[0], "device lost") {
		t.Fatalf("failures %q, want the quarantined buffer named with its error", f)
	}
	// Its bytes stay visible, charged and quarantined: never lost.
	if s := h.Snapshot(); s.Quarantined != 4096 {
		t.Fatalf("quarantined %d, want 4096", s.Quarantined)
	}
	h.Fake.ClearFaults()
	if err := buf.Close(); err != nil { // Close retries a quarantined release
		t.Fatal(err)
	}
}

// A release waiting on a fence that never completes does not hang the
// cleanup: it is reported once the drain bound passed.
func TestAFenceThatNeverCompletesDoesNotHang(t *testing.T) {
	rec := &recTB{TB: t}
	h := memgentest.New(rec, memgentest.Options{Drain: 200 * time.Millisecond})
	b := h.Bind("act", "scratch")
	buf, err := b.Allocate(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	h.FakeContext.SetManualFences(true)
	s, err := h.FakeContext.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	fence, err := s.Record()
	if err != nil {
		t.Fatal(err)
	}
	if err := buf.RecordUse(fence); err != nil {
		t.Fatal(err)
	}
	if err := buf.Close(); err != nil {
		t.Fatal(err)
	}
	watchdog.Within(t, watchdog.Bound, "the cleanup with a 200 ms drain bound", func() { rec.run() })
	f := rec.failures()
	if len(f) != 1 || !strings.Contains(f[0], "act/scratch buffer") || !strings.Contains(f[0], "never completed") {
		t.Fatalf("failures %q, want the pending buffer named", f)
	}
	// Let the device finish, and take the context down for real.
	h.FakeContext.CompleteAll()
	_ = s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.Context.Close(ctx, true); err != nil {
		t.Fatal(err)
	}
}

// An Allocate past the budget on context.Background() fails after the
// harness's wait instead of blocking the test.
func TestOverBudgetFailsInsteadOfHanging(t *testing.T) {
	h := memgentest.New(t, memgentest.Options{Capacity: 1 << 20, Wait: 50 * time.Millisecond})
	b := h.Bind("kv", "cache")
	buf, err := b.Allocate(context.Background(), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	_, err = b.Allocate(context.Background(), 4096)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, memapi.ErrOverBudget) {
		t.Fatalf("error %v, want ErrOverBudget after the default wait", err)
	}
	if !strings.Contains(err.Error(), "default wait of 50ms") {
		t.Fatalf("error %v does not name the harness's wait (Options.Wait)", err)
	}
}

// The authority is named once, in Options: the governor, the mechanism and
// the device all use it.
func TestOneAuthorityName(t *testing.T) {
	h := memgentest.New(t, memgentest.Options{Authority: "gpu0"})
	if got := h.Mechanism.Info().Authority; got != "gpu0" {
		t.Fatalf("mechanism accounts to %q", got)
	}
	b := h.Bind("kv", "cache")
	if a, err := b.Authority(); err != nil || a != "gpu0" {
		t.Fatalf("binding authority %q, %v", a, err)
	}
	if _, ok := h.Governor.Authority("gpu0"); !ok {
		t.Fatal("the governor lacks the authority")
	}
}

// A release stuck in a mechanism call that never returns (a Free that
// hangs) does not hold the cleanup: it returns, reporting the handle and
// every goroutine's stack, the hung Free among them. It used to wait until
// the Free returned.
func TestAHangingFreeDoesNotHangTheCleanup(t *testing.T) {
	rec := &recTB{TB: t}
	h := memgentest.New(rec, memgentest.Options{Drain: 100 * time.Millisecond})
	b := h.Bind("act", "scratch")
	if _, err := b.Allocate(context.Background(), 4096); err != nil { // left open: the cleanup closes it
		t.Fatal(err)
	}
	release := make(chan struct{})
	h.Fake.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrUnavailable, When: func(fakes.Call) bool {
		<-release
		return false
	}})
	watchdog.Within(t, watchdog.Bound, "the cleanup with a Free that hangs", func() { rec.run() })
	close(release)
	f := rec.failures()
	all := strings.Join(f, "\n")
	for _, want := range []string{"did not return within the drain bound of 100ms", "act/scratch buffer", "goroutine ", "fakes."} {
		if !strings.Contains(all, want) {
			t.Errorf("failures do not say %q:\n%s", want, all)
		}
	}
}
