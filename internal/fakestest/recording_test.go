package fakestest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/memapi"
)

func TestCallCountAndArgsForCall(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{})
	a1, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, g)
	ok(t, err)
	a2, err := m.Allocate(bg, memapi.AllocRequest{Size: 2, Align: 8}, nil)
	is(t, err, memapi.ErrNoGrant)
	if a2 != nil {
		t.Fatal("failed Allocate returned a handle")
	}
	ok(t, m.Free(bg, a1, acct))
	if n := m.AllocateCallCount(); n != 2 {
		t.Fatalf("AllocateCallCount = %d, want 2", n)
	}
	if n := m.FreeCallCount(); n != 1 {
		t.Fatalf("FreeCallCount = %d, want 1", n)
	}
	_, req, grant := m.AllocateArgsForCall(1)
	if req != (memapi.AllocRequest{Size: 2, Align: 8}) || grant != nil {
		t.Fatalf("AllocateArgsForCall(1) = %+v, %v", req, grant)
	}
	_, freed, to := m.FreeArgsForCall(0)
	if freed != a1 || to != memapi.Account(acct) {
		t.Fatal("FreeArgsForCall(0) did not return the arguments")
	}
}

func TestRecorderKeepsOneGlobalOrder(t *testing.T) {
	rec := fakes.NewRecorder()
	m, c, _, acct := newFake(t, fakes.Config{Name: "gpu", Recorder: rec})
	rec.Reset() // newFake asked Info for the authority
	g := fakes.NewGrant("fake", 1<<20)
	g.SetRecorder(rec)
	acct.SetRecorder(rec)
	ok(t, g.Draw(4096))
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 4096}, g)
	ok(t, err)
	s, err := c.NewStream()
	ok(t, err)
	buf := []byte("abc")
	ok(t, s.CopyToDevice(a.Addr(), buf))
	buf[0] = 'X' // the recorded argument must not change
	f, err := s.Record()
	ok(t, err)
	ok(t, f.Wait(bg))
	ok(t, m.Free(bg, a, acct))
	ok(t, acct.Refund(4096))
	ok(t, s.Close())

	want := []string{"grant:fake.Draw", "gpu.Allocate", "gpu.context.NewStream", "gpu.stream#1.CopyToDevice",
		"gpu.stream#1.Record", "gpu.fence#1.Wait", "gpu.Free", "account:fake.Refund", "gpu.stream#1.Close"}
	if got := rec.Methods(); !slices.Equal(got, want) {
		t.Fatalf("recorded\n  %v\nwant\n  %v", got, want)
	}
	calls := rec.Calls()
	for i := 1; i < len(calls); i++ {
		if calls[i].Seq <= calls[i-1].Seq {
			t.Fatalf("sequence not increasing at %d: %d after %d", i, calls[i].Seq, calls[i-1].Seq)
		}
	}
	if got := calls[3].Args[1].([]byte); string(got) != "abc" {
		t.Fatalf("recorded copy source %q, want %q", got, "abc")
	}
	if calls[1].Args[1] != (memapi.AllocRequest{Size: 4096}) {
		t.Fatalf("recorded Allocate args %v", calls[1].Args)
	}
	rec.Reset()
	if len(rec.Calls()) != 0 {
		t.Fatal("Reset kept calls")
	}
	m.UsedBytes()
	if c := rec.Calls(); len(c) != 1 || c[0].Seq <= calls[len(calls)-1].Seq {
		t.Fatalf("after Reset: %+v", c)
	}
}

func TestRecorderKeepsErrors(t *testing.T) {
	rec := fakes.NewRecorder()
	m, _, _, _ := newFake(t, fakes.Config{Recorder: rec})
	rec.Reset()
	_, err := m.Allocate(bg, memapi.AllocRequest{Size: 1}, nil)
	calls := rec.Calls()
	if len(calls) != 1 || calls[0].Err != err || !errors.Is(calls[0].Err, memapi.ErrNoGrant) {
		t.Fatalf("recorded %+v, want the ErrNoGrant error", calls)
	}
}

func TestReturnsReturnsOnCallCallsRestore(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{})
	boom := errors.New("boom")

	m.UsedBytesReturns(42)
	if m.UsedBytes() != 42 {
		t.Fatal("UsedBytesReturns ignored")
	}
	m.UsedBytesReturnsOnCall(2, 7)
	if m.UsedBytes() != 42 || m.UsedBytes() != 7 || m.UsedBytes() != 42 {
		t.Fatal("UsedBytesReturnsOnCall(2) did not pick the third call")
	}

	var seen []memapi.Bytes
	m.AllocateCalls(func(ctx context.Context, req memapi.AllocRequest, gr memapi.Grant) (*memapi.Allocation, error) {
		seen = append(seen, req.Size)
		return nil, boom
	})
	_, err := m.Allocate(bg, memapi.AllocRequest{Size: 3}, g)
	if err != boom || !slices.Equal(seen, []memapi.Bytes{3}) {
		t.Fatalf("stub not called: err %v seen %v", err, seen)
	}
	// Returns drops the stub, as in counterfeiter.
	m.AllocateReturns(nil, memapi.ErrOutOfMemory)
	_, err = m.Allocate(bg, memapi.AllocRequest{Size: 3}, g)
	is(t, err, memapi.ErrOutOfMemory)
	if len(seen) != 1 {
		t.Fatal("stub still called after Returns")
	}

	m.Restore()
	if m.UsedBytes() != 0 {
		t.Fatal("Restore kept the canned UsedBytes")
	}
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 3}, g)
	ok(t, err)
	used(t, m, 4096)
	ok(t, m.Free(bg, a, acct))
	if m.AllocateCallCount() != 3 {
		t.Fatalf("AllocateCallCount = %d, want 3 (stubs and canned results count)", m.AllocateCallCount())
	}
}

func TestFaultOnNthCall(t *testing.T) {
	m, _, g, _ := newFake(t, fakes.Config{})
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 8 * g64})
	ok(t, err)
	ok(t, m.Commit(bg, res, memapi.Range{Off: 0, Len: g64}, g)) // call 1
	m.Inject(fakes.Fault{Method: "Commit", Nth: 3, Err: memapi.ErrOutOfMemory})
	ok(t, m.Commit(bg, res, memapi.Range{Off: g64, Len: g64}, g)) // call 2
	err = m.Commit(bg, res, memapi.Range{Off: 2 * g64, Len: g64}, g)
	is(t, err, memapi.ErrOutOfMemory)
	var me *memapi.Error
	if !errors.As(err, &me) || !strings.Contains(me.Error(), "injected fault on call 3") {
		t.Fatalf("fault error %v does not say which call", err)
	}
	committed(t, m, res, 2*g64) // the faulted call changed nothing
	used(t, m, 2*g64)
	ok(t, m.Commit(bg, res, memapi.Range{Off: 2 * g64, Len: g64}, g)) // call 4 passes
	committed(t, m, res, 3*g64)
}

func TestFaultByPredicateAndClear(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{})
	custom := &memapi.Error{Op: "test", Kind: memapi.ErrUnavailable}
	m.Inject(fakes.Fault{Method: "Allocate", When: func(c fakes.Call) bool {
		return c.Args[1].(memapi.AllocRequest).Size > 1000
	}, Err: custom})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 10}, g)
	ok(t, err)
	_, err = m.Allocate(bg, memapi.AllocRequest{Size: 2000}, g)
	if err != custom {
		t.Fatalf("got %v, want the injected *memapi.Error itself", err)
	}
	used(t, m, 4096)
	m.ClearFaults()
	b, err := m.Allocate(bg, memapi.AllocRequest{Size: 2000}, g)
	ok(t, err)
	ok(t, m.Free(bg, a, acct))
	ok(t, m.Free(bg, b, acct))
}

func TestFaultComesBeforeStubs(t *testing.T) {
	m, _, _, acct := newFake(t, fakes.Config{})
	m.FreeReturns(nil)
	m.Inject(fakes.Fault{Method: "Free", Err: memapi.ErrInUse})
	is(t, m.Free(bg, nil, acct), memapi.ErrInUse)
}

func TestFaultOnReleaseKeepsHandleLive(t *testing.T) {
	m, _, g, acct := newFake(t, fakes.Config{})
	a, err := m.Allocate(bg, memapi.AllocRequest{Size: 10}, g)
	ok(t, err)
	m.Inject(fakes.Fault{Method: "Free", Nth: 1, Err: memapi.ErrUnavailable})
	is(t, m.Free(bg, a, acct), memapi.ErrUnavailable)
	if !a.Live() {
		t.Fatal("a faulted Free released the handle")
	}
	used(t, m, 4096)
	ok(t, m.Free(bg, a, acct))
}

// Any memapi.Injector can be installed: it sees the fakes' layer, the
// method, the call's number and the Call, and its error is reported as a
// Fault's, marked injected; the fake's accounting does not move.
func TestInjectWith(t *testing.T) {
	m, _, g, _ := newFake(t, fakes.Config{})
	res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 8 * g64})
	ok(t, err)
	var trace memapi.Trace
	rule := memapi.Fail(memapi.ErrOutOfMemory).On(fakes.Layer, "Commit").When(func(op memapi.Op) bool {
		return op.Args.(fakes.Call).Args[2].(memapi.Range).Off == 2*g64
	})
	m.InjectWith(memapi.Any(&trace, rule))
	ok(t, m.Commit(bg, res, memapi.Range{Off: 0, Len: g64}, g))
	err = m.Commit(bg, res, memapi.Range{Off: 2 * g64, Len: g64}, g)
	is(t, err, memapi.ErrOutOfMemory)
	is(t, err, memapi.ErrInjected)
	committed(t, m, res, g64)
	used(t, m, g64)
	var calls []int
	for _, op := range trace.Ops() {
		if op.Layer != fakes.Layer {
			t.Fatalf("the injector saw %v", op)
		}
		if op.Name == "Commit" {
			calls = append(calls, op.Call)
		}
	}
	if !slices.Equal(calls, []int{1, 2}) || rule.Fired() != 1 {
		t.Fatalf("the injector saw calls %v and fired %d times, want [1 2] and once", calls, rule.Fired())
	}
	m.ClearFaults()
	ok(t, m.Commit(bg, res, memapi.Range{Off: 2 * g64, Len: g64}, g))
	committed(t, m, res, 2*g64)
}

func TestInjectRejectsUnknownMethods(t *testing.T) {
	m, _, _, _ := newFake(t, fakes.Config{})
	for _, f := range []fakes.Fault{
		{Method: "Comit", Err: memapi.ErrOutOfMemory},
		{Method: "UsedBytes", Err: memapi.ErrOutOfMemory}, // no error result: cannot fail
		{Method: "Commit"},
	} {
		t.Run(fmt.Sprintf("%s/%v", f.Method, f.Err), func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Inject accepted a fault that can never fire")
				}
			}()
			m.Inject(f)
		})
	}
}

func TestLedgerFakes(t *testing.T) {
	g := fakes.NewGrant("host", 100)
	if g.Authority() != "host" {
		t.Fatal("authority")
	}
	ok(t, g.Draw(60))
	err := g.Draw(50)
	is(t, err, memapi.ErrGrantExhausted)
	var me *memapi.Error
	if !errors.As(err, &me) || me.Wanted != 50 || me.Available != 40 {
		t.Fatalf("exhausted error lacks figures: %v", err)
	}
	ok(t, g.Undraw(10))
	if g.Drawn() != 50 || g.Remaining() != 50 {
		t.Fatalf("drawn %d remaining %d", g.Drawn(), g.Remaining())
	}
	is(t, g.Undraw(51), memapi.ErrInvalidSize)
	ok(t, g.Refund(50)) // a grant is also an account
	ok(t, g.Close())
	is(t, g.Draw(1), memapi.ErrGrantClosed)
	if g.DrawCallCount() != 3 || g.RefundCallCount() != 1 {
		t.Fatalf("grant counts: draw %d refund %d", g.DrawCallCount(), g.RefundCallCount())
	}

	a := fakes.NewAccount("host")
	ok(t, a.Refund(7))
	ok(t, a.Refund(8))
	if a.Refunded() != 15 || a.Authority() != "host" {
		t.Fatalf("account refunded %d", a.Refunded())
	}
	a.Inject(fakes.Fault{Method: "Refund", Nth: 3, Err: memapi.ErrClosed})
	is(t, a.Refund(1), memapi.ErrClosed)
	if a.Refunded() != 15 {
		t.Fatal("a faulted refund counted")
	}
	g2 := fakes.NewGrant("host", 10)
	g2.DrawReturns(memapi.ErrOverBudget)
	is(t, g2.Draw(1), memapi.ErrOverBudget)
	if g2.Drawn() != 0 {
		t.Fatal("canned Draw moved the state")
	}
}
