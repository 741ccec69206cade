//go:build memgentmpl

package checked

import (
	"errors"
	"fmt"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// audit is what verify mode saw around one mutating call: the figures the spec
// says the call moves, and every disagreement between what the mechanism
// reported and what its counters show.
type audit struct {
	m         *mechanism
	op        string
	effect    memapi.Effect
	amount    memapi.Bytes    // the rounded amount the call declares
	err       error           // the mechanism's own result
	measured  bool            // moved holds the primary figure's movement
	moved     memapi.Bytes    // how far the primary figure moved the declared way
	disagree  bool            // another figure moved by a different amount
	settled   memapi.Bytes    // what settleDraw kept drawn or settleRefund refunded
	before    [4]memapi.Bytes // each figure read before the call
	beforeErr [4]error
	faults    []error
}

// want is how far the figures must have moved: the amount after a successful
// consuming or refunding call, nothing otherwise.
func (a *audit) want() memapi.Bytes {
	if a.err != nil || (a.effect != memapi.EffectConsumes && a.effect != memapi.EffectRefunds) {
		return 0
	}
	return a.amount
}

// figure compares counter i, read before the call (before[i], beforeErr[i]) and
// after it, with the declared movement (up for consuming calls, down for
// refunding ones). Figure 0 of a call is its primary one: the ledger settles on
// its observed movement.
func (a *audit) figure(i int, name string, after memapi.Bytes, aerr error) {
	before, berr := a.before[i], a.beforeErr[i]
	if berr != nil || aerr != nil {
		a.faults = append(a.faults, fmt.Errorf("%s: reading %s: %w", a.op, name, errors.Join(berr, aerr)))
		return
	}
	down := a.effect == memapi.EffectRefunds
	var delta memapi.Bytes
	grew := after >= before
	if grew {
		delta = after - before
	} else {
		delta = before - after
	}
	var moved memapi.Bytes
	if delta != 0 && grew != down {
		moved = delta
	}
	if !a.measured {
		a.measured, a.moved = true, moved
	} else if moved != a.moved {
		a.disagree = true
	}
	want := a.want()
	if delta == 0 && want == 0 || moved == want && delta == want {
		return
	}
	sign, wsign := "+", "+"
	if !grew {
		sign = "-"
	}
	if down {
		wsign = "-"
	}
	outcome := "success"
	if a.err != nil {
		outcome = "failure"
	}
	a.faults = append(a.faults, &memapi.Error{
		Authority: a.m.info.Authority,
		Available: delta,
		Detail:    fmt.Sprintf("after %s %s moved by %s%d bytes, not %s%d", outcome, name, sign, delta, wsign, want),
		Kind:      memapi.ErrUntruthful,
		Mechanism: a.m.info.Mechanism,
		Op:        a.op,
		Wanted:    want,
	})
}

// created checks a handle the mechanism reported creating: live and made by
// this instance.
func (a *audit) created(h memapi.Handle) {
	if a.err != nil {
		return
	}
	if err := memapi.CheckHandle(a.op, h, a.m.info.Instance); err != nil {
		a.faults = append(a.faults, &memapi.Error{
			Authority: a.m.info.Authority,
			Detail:    "reported success but the handle it returned is not usable",
			Err:       err,
			Kind:      memapi.ErrUntruthful,
			Mechanism: a.m.info.Mechanism,
			Op:        a.op,
		})
	}
}

// size checks that a created handle's size is the amount charged for it.
func (a *audit) size(name string, got memapi.Bytes) {
	if a.err != nil || got == a.amount {
		return
	}
	a.faults = append(a.faults, &memapi.Error{
		Authority: a.m.info.Authority,
		Available: got,
		Detail:    fmt.Sprintf("%s is %d bytes, but %d were charged", name, got, a.amount),
		Kind:      memapi.ErrUntruthful,
		Mechanism: a.m.info.Mechanism,
		Op:        a.op,
		Wanted:    a.amount,
	})
}

// released checks a handle the call releases: released after success, still
// live after failure.
func (a *audit) released(name string, h memapi.Handle) {
	live := h.Live()
	switch {
	case a.err == nil && live:
		a.faults = append(a.faults, &memapi.Error{
			Authority: a.m.info.Authority,
			Detail:    "reported success but " + name + " is still live",
			Kind:      memapi.ErrUntruthful,
			Mechanism: a.m.info.Mechanism,
			Op:        a.op,
		})
	case a.err != nil && !live:
		a.faults = append(a.faults, &memapi.Error{
			Authority: a.m.info.Authority,
			Detail:    "failed but released " + name,
			Kind:      memapi.ErrUntruthful,
			Mechanism: a.m.info.Mechanism,
			Op:        a.op,
		})
	}
}

// result is the mechanism's error, joined with every finding.
func (a *audit) result() error {
	if len(a.faults) == 0 {
		return a.err
	}
	return errors.Join(append([]error{a.err}, a.faults...)...)
}

// settleDraw makes the grant reflect what the mechanism really installed: the
// figures' observed growth when they were measured and agree with each other,
// else (the truth is unknown) the drawn amount after success and nothing after
// failure. A surplus is undrawn (a commit that installed nothing gives
// everything back); an excess is drawn, which the grant may refuse.
func (a *audit) settleDraw(grant memapi.Grant, drawn memapi.Bytes) error {
	var actual memapi.Bytes
	switch {
	case a.measured && !a.disagree:
		actual = a.moved
	case a.err == nil:
		actual = drawn
	}
	switch {
	case actual < drawn:
		if err := grant.Undraw(drawn - actual); err != nil {
			a.faults = append(a.faults, err)
		}
	case actual > drawn:
		if err := grant.Draw(actual - drawn); err != nil {
			a.faults = append(a.faults, err)
			actual = drawn
		}
	}
	a.settled = actual
	return a.result()
}

// settleRefund refunds what the mechanism really released: the figures'
// observed shrinkage when they agree, capped at the amount due (bytes beyond it
// were not this account's); else the amount due after success and nothing after
// failure.
func (a *audit) settleRefund(to memapi.Account, due memapi.Bytes) error {
	var freed memapi.Bytes
	switch {
	case a.measured && !a.disagree:
		freed = min(a.moved, due)
	case a.err == nil:
		freed = due
	}
	if err := refund(to, freed); err != nil {
		a.faults = append(a.faults, err)
	}
	a.settled = freed
	return a.result()
}
