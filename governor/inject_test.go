package governor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

var errInjected = errors.New("injected fault")

// The operations' names, as the Injector sees them.
const (
	OpReserve           = "governor.Reserve"
	OpDraw              = "governor.Grant.Draw"
	OpUndraw            = "governor.Grant.Undraw"
	OpGrantRefund       = "governor.Grant.Refund"
	OpCommit            = "governor.Grant.Commit"
	OpCancel            = "governor.Grant.Cancel"
	OpRefund            = "governor.Lease.Refund"
	OpMarkPending       = "governor.Lease.MarkPending"
	OpQuarantine        = "governor.Lease.Quarantine"
	OpRefundQuarantined = "governor.Lease.RefundQuarantined"
)

// injected is one consultation of the injector.
type injected struct {
	op    string
	auth  memapi.AuthorityID
	bytes memapi.Bytes
}

// opInjector fails every consultation at fail, and records them all.
type opInjector struct {
	mu   sync.Mutex
	fail string
	seen []injected
}

func (f *opInjector) MaybeError(o memapi.Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	op := o.String()
	f.seen = append(f.seen, injected{op, o.Authority, o.Bytes})
	if o.Layer != "governor" || o.Call != 0 || o.Args != nil {
		return fmt.Errorf("the governor asked about %+v", o)
	}
	if op == f.fail {
		return errInjected
	}
	return nil
}

func (f *opInjector) set(op string) {
	f.mu.Lock()
	f.fail, f.seen = op, nil
	f.mu.Unlock()
}

func newInjected(t *testing.T) (*Governor, *opInjector) {
	t.Helper()
	f := &opInjector{}
	g := New(Options{Injector: f})
	t.Cleanup(func() { g.Close() })
	if err := g.AddAuthority(hostA, 1000); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("kv", nil, HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	return g, f
}

// The injector is consulted at every named point, with the operation's
// authority and bytes, in the order the operations run.
func TestInjectorSeesEveryOp(t *testing.T) {
	g, f := newInjected(t)
	ctx := context.Background()
	gr, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	step := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	step(gr.Draw(60))
	step(gr.Undraw(10))
	l, err := gr.Commit()
	step(err)
	step(l.MarkPending(20))
	step(l.Quarantine(10))
	step(l.QuarantinedAccount().Refund(10))
	step(l.Refund(40))
	gr, err = g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 30})
	step(err)
	step(gr.Cancel())
	want := []injected{{OpReserve, hostA, 100}, {OpDraw, hostA, 60}, {OpUndraw, hostA, 10}, {OpCommit, hostA, 0},
		{OpMarkPending, hostA, 20}, {OpQuarantine, hostA, 10}, {OpRefundQuarantined, hostA, 10}, {OpRefund, hostA, 40},
		{OpReserve, hostA, 30}, {OpCancel, hostA, 0}}
	if !slices.Equal(f.seen, want) {
		t.Fatalf("consulted %v, want %v", f.seen, want)
	}
	if s, _ := g.Authority(hostA); s.Free != 1000 || s.Granted != 2 {
		t.Fatalf("after the operations: %+v", s)
	}
}

// An operation the injector fails returns its error and changes nothing:
// the figures are as before, and the same operation then succeeds.
func TestInjectorFailsEveryOpChangingNothing(t *testing.T) {
	ctx := context.Background()
	// Each case brings a grant (and its lease) to where op applies, then
	// runs op.
	type state struct {
		gr Grant
		l  Lease
	}
	reserve := func(t *testing.T, g *Governor) state {
		gr, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 100})
		if err != nil {
			t.Fatal(err)
		}
		if err := gr.Draw(60); err != nil {
			t.Fatal(err)
		}
		return state{gr: gr}
	}
	commit := func(t *testing.T, g *Governor) state {
		s := reserve(t, g)
		l, err := s.gr.Commit()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Quarantine(10); err != nil {
			t.Fatal(err)
		}
		return state{s.gr, l}
	}
	none := func(*testing.T, *Governor) state { return state{} }
	cases := []struct {
		op    string
		setup func(*testing.T, *Governor) state
		run   func(*Governor, state) error
	}{
		{OpReserve, none, func(g *Governor, _ state) error {
			_, err := g.Reserve(ctx, Request{Authority: hostA, Holder: "kv", Bytes: 10})
			return err
		}},
		{OpDraw, reserve, func(_ *Governor, s state) error { return s.gr.Draw(10) }},
		{OpUndraw, reserve, func(_ *Governor, s state) error { return s.gr.Undraw(10) }},
		{OpGrantRefund, reserve, func(_ *Governor, s state) error { return s.gr.Refund(10) }},
		{OpCommit, reserve, func(_ *Governor, s state) error { _, err := s.gr.Commit(); return err }},
		{OpCancel, func(t *testing.T, g *Governor) state {
			s := reserve(t, g)
			if err := s.gr.Undraw(60); err != nil {
				t.Fatal(err)
			}
			return s
		}, func(_ *Governor, s state) error { return s.gr.Cancel() }},
		{OpRefund, commit, func(_ *Governor, s state) error { return s.l.Refund(10) }},
		{OpMarkPending, commit, func(_ *Governor, s state) error { return s.l.MarkPending(10) }},
		{OpQuarantine, commit, func(_ *Governor, s state) error { return s.l.Quarantine(10) }},
		{OpRefundQuarantined, commit, func(_ *Governor, s state) error { return s.l.refundQuarantined(10) }},
		{OpRefundQuarantined, commit, func(_ *Governor, s state) error { return s.l.QuarantinedAccount().Refund(10) }},
	}
	for _, c := range cases {
		t.Run(c.op, func(t *testing.T) {
			g, f := newInjected(t)
			s := c.setup(t, g)
			before, _ := g.Authority(hostA)
			f.set(c.op)
			err := c.run(g, s)
			var me *memapi.Error
			if !errors.Is(err, errInjected) || !errors.Is(err, memapi.ErrInjected) || !errors.As(err, &me) || me.Op != c.op || me.Authority != hostA {
				t.Fatalf("%v with the fault injected: %v", c.op, err)
			}
			if after, _ := g.Authority(hostA); !sameFigures(after, before) {
				t.Fatalf("an injected fault moved the ledger: %+v -> %+v", before, after)
			}
			f.set("")
			if err := c.run(g, s); err != nil {
				t.Fatalf("%v once the fault cleared: %v", c.op, err)
			}
		})
	}
}

// sameFigures compares what an operation moves.
func sameFigures(a, b AuthoritySnapshot) bool {
	return a.Reserved == b.Reserved && a.Drawn == b.Drawn && a.Charged == b.Charged && a.Pending == b.Pending &&
		a.Quarantined == b.Quarantined && a.Free == b.Free && a.Grants == b.Grants && a.Leases == b.Leases && a.Granted == b.Granted
}

// The contract's rules work as the governor's Injector: here the second
// Reserve on an authority fails as if it were over budget, changing
// nothing, and the third succeeds.
func TestInjectorRule(t *testing.T) {
	rule := memapi.Fail(memapi.ErrOverBudget).On("governor", "Reserve").When(func(op memapi.Op) bool { return op.Authority == hostA }).Nth(2)
	g := New(Options{Injector: rule})
	t.Cleanup(func() { g.Close() })
	if err := g.AddAuthority(hostA, 1000); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("kv", nil, HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := Request{Authority: hostA, Holder: "kv", Bytes: 100}
	if _, err := g.Reserve(ctx, r); err != nil {
		t.Fatal(err)
	}
	before, _ := g.Authority(hostA)
	_, err := g.Reserve(ctx, r)
	var me *memapi.Error
	if !errors.As(err, &me) || me.Kind != memapi.ErrOverBudget || me.Wanted != 100 || !errors.Is(err, memapi.ErrInjected) {
		t.Fatalf("the second Reserve: %v", err)
	}
	if after, _ := g.Authority(hostA); !sameFigures(after, before) {
		t.Fatalf("an injected fault moved the ledger: %+v -> %+v", before, after)
	}
	if _, err := g.Reserve(ctx, r); err != nil || rule.Fired() != 1 {
		t.Fatalf("the third Reserve: %v (fired %d)", err, rule.Fired())
	}
}
