package conformancetest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
)

// slowAllocator is a fake whose Allocate first waits: delay, or, when hang
// is set, until its context ends (a call that makes no progress).
type slowAllocator struct {
	memapi.Mechanism
	delay time.Duration
	hang  bool
	calls *atomic.Int64
}

func (s slowAllocator) Allocate(ctx context.Context, req memapi.AllocRequest, g memapi.Grant) (*memapi.Allocation, error) {
	s.calls.Add(1)
	if s.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	time.Sleep(s.delay)
	return s.Mechanism.Allocate(ctx, req, g)
}

func slowSubjects(delay time.Duration, hang bool, opTimeout time.Duration, calls *atomic.Int64) conformance.FactoryT {
	return func(t conformance.T) conformance.Subject {
		m := fakes.NewMechanism(fakes.Config{Offers: memapi.Of(memapi.CapDeviceAllocator)})
		ctx := fakes.NewContext(m)
		t.Cleanup(func() { _ = ctx.Close() })
		d := m.Declaration()
		return conformance.Subject{
			Declared:  &d,
			Mechanism: slowAllocator{Mechanism: m, delay: delay, hang: hang, calls: calls},
			Context:   ctx,
			Lacks:     memapi.Of(memapi.CapVirtualBacking, memapi.CapSharedMapping),
			OpTimeout: opTimeout,
		}
	}
}

// A deadline bounds one call, never a subtest: every Allocate takes 5 ms
// and each call gets a second, so concurrency/stress (300 Allocates in a
// row per worker, 1.5 s and more) passes, as does the whole suite.
func TestDeadlineBoundsEachCall(t *testing.T) {
	var calls atomic.Int64
	res := run(func(root conformance.T) {
		conformance.RunT(root, slowSubjects(5*time.Millisecond, false, time.Second, &calls))
	})
	if f := res.Failed(); len(f) > 0 {
		t.Fatalf("with each call under its deadline, subtests failed:\n%s", res.Report())
	}
	if o, ok := res.Outcome("concurrency/stress"); !ok || o.Skipped {
		t.Fatalf("concurrency/stress did not run: %+v", o)
	}
	if n := calls.Load(); n < int64(conformance.StressRounds) {
		t.Fatalf("%d Allocate calls in the whole suite: the stress did not run its rounds", n)
	}
}

// A call that passes its deadline is reported as a timeout, naming the
// call and with every goroutine's stack,
// never as a leak or a ledger that does not balance.
func TestTimeoutReportedAsTimeout(t *testing.T) {
	var calls atomic.Int64
	res := run(func(root conformance.T) {
		conformance.RunT(root, slowSubjects(0, true, 20*time.Millisecond, &calls))
	})
	failed := res.Failed()
	if len(failed) == 0 {
		t.Fatal("no subtest failed with every Allocate hanging")
	}
	timedOut := 0
	for _, name := range failed {
		o, _ := res.Outcome(name)
		log := strings.Join(o.Log, "\n")
		for _, bad := range []string{"leak:", "ledger:"} {
			if strings.Contains(log, bad) {
				t.Errorf("%s reports %q after a timeout:\n%s", name, bad, log)
			}
		}
		if strings.Contains(log, "timeout: DeviceAllocator.Allocate did not return within 20ms") {
			timedOut++
			// The stacks are taken when the deadline passes, in another
			// goroutine: a call that honours its context may be gone by then.
			if !strings.Contains(log, "goroutines when it expired:\ngoroutine ") {
				t.Errorf("%s: the timeout report has no stacks:\n%s", name, log)
			}
		}
	}
	if timedOut == 0 {
		t.Fatalf("no failed subtest reports its Allocate as a timeout:\n%s", res.Report())
	}
	if o, _ := res.Outcome("concurrency/stress"); !o.Failed || !strings.Contains(strings.Join(o.Log, "\n"), "timeout: DeviceAllocator.Allocate") {
		t.Errorf("concurrency/stress: %+v, want a timeout report", o)
	}
}
