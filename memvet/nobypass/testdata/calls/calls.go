// Package calls is a downstream package that calls capability methods, some
// through the checked wrapper and some around it.
package calls

import (
	"context"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

var ctx = context.Background()

// Raw calls: a concrete mechanism, the same value as an interface, a method
// value, a capability reached from a raw mechanism.
func raw(g memapi.Grant, to memapi.Account) {
	m := fakes.NewMechanism(fakes.Config{})
	a, _ := m.Allocate(ctx, memapi.AllocRequest{Size: 1}, g) // want `DeviceAllocator.Allocate consumes from a grant and is called on a value that is not the checked wrapper`
	_ = m.Free(ctx, a, to)                                   // want `DeviceAllocator.Free refunds to an account`
	var mm memapi.Mechanism = m
	_, _ = mm.Allocate(ctx, memapi.AllocRequest{Size: 1}, g) // want `DeviceAllocator.Allocate consumes`
	alloc := mm.Allocate                                     // want `DeviceAllocator.Allocate consumes`
	_ = alloc
	if vb, err := memapi.RequireVirtualBacking(m); err == nil {
		_ = vb.Commit(ctx, nil, memapi.Range{}, g) // want `VirtualBacking.Commit consumes`
	}
	mm = checked.Wrap(m, fakes.Ledger)
	_ = mm.UsedBytes() // queries are not checked
}

// Exported parameters come from callers memvet does not see.
func Exported(m memapi.Mechanism, a *memapi.Allocation, to memapi.Account) error {
	return m.Free(ctx, a, to) // want `DeviceAllocator.Free refunds`
}

// Through the wrapper: directly, through a field, through an unexported
// helper, through a Require helper or accessor of a wrapped mechanism.
type owner struct {
	mech memapi.Mechanism
	sm   memapi.SharedMapping
}

func newOwner(m memapi.Mechanism) *owner {
	o := &owner{mech: wrap(m)}
	if sm, ok := o.mech.AsSharedMapping(); ok {
		o.sm = sm
	}
	return o
}

func wrap(m memapi.Mechanism) memapi.Mechanism {
	return checked.Wrap(m, fakes.Ledger, checked.WithVerify())
}

func (o *owner) use(g memapi.Grant, to memapi.Account) error {
	a, err := o.mech.Allocate(ctx, memapi.AllocRequest{Size: 1}, g)
	if err != nil {
		return err
	}
	if err := free(o.mech, a, to); err != nil {
		return err
	}
	b, err := o.sm.CreateBacking(ctx, 1, g)
	if err != nil {
		return err
	}
	vb, err := memapi.RequireVirtualBacking(o.mech)
	if err != nil {
		return err
	}
	_ = vb.Commit(ctx, nil, memapi.Range{}, g)
	return o.sm.ReleaseBacking(ctx, b, to)
}

func free(m memapi.Mechanism, a *memapi.Allocation, to memapi.Account) error {
	return m.Free(ctx, a, to)
}

// A field that is once assigned a raw mechanism is not checked anywhere.
type mixed struct{ mech memapi.Mechanism }

func newMixed(m memapi.Mechanism, wrapped bool) *mixed {
	if wrapped {
		return &mixed{mech: checked.Wrap(m, fakes.Ledger)}
	}
	return &mixed{mech: m}
}

func (x *mixed) alloc(g memapi.Grant) {
	_, _ = x.mech.Allocate(ctx, memapi.AllocRequest{Size: 1}, g) // want `DeviceAllocator.Allocate consumes`
}

// An unexported helper called once with a raw value is not checked.
func helper(m memapi.Mechanism, g memapi.Grant) {
	_, _ = m.Allocate(ctx, memapi.AllocRequest{Size: 1}, g) // want `DeviceAllocator.Allocate consumes`
}

func callers(g memapi.Grant) {
	m := fakes.NewMechanism(fakes.Config{})
	helper(checked.Wrap(m, fakes.Ledger), g)
	helper(m, g)
}

// The escape, with its reason.
func escaped(g memapi.Grant) {
	m := fakes.NewMechanism(fakes.Config{})
	//memvet:allow the conformance of a raw mechanism is what this measures
	_, _ = m.Allocate(ctx, memapi.AllocRequest{Size: 1}, g)
}
