// Package negotiate is a downstream package that asks for optional
// capabilities, and sometimes does not listen to the answer.
package negotiate

import (
	"context"
	"errors"

	"github.com/memgen/memgen/generated/memapi"
)

var ctx = context.Background()

// The answer ignored.

func ignoredErr(m memapi.Mechanism) {
	vb, _ := memapi.RequireVirtualBacking(m) // want `the error of RequireVirtualBacking is ignored: VirtualBacking may be absent`
	_, _ = vb.Reserve(ctx, memapi.ReserveRequest{Size: 1})
}

func ignoredOk(m memapi.Mechanism) memapi.SharedMapping {
	sm, _ := m.AsSharedMapping() // want `the ok of AsSharedMapping is ignored: SharedMapping may be absent`
	return sm
}

func ignoredAll(m memapi.Mechanism) {
	memapi.RequireSharedMapping(m) // want `the result of RequireSharedMapping is ignored`
	m.AsVirtualBacking()           // want `the result of AsVirtualBacking is ignored`
}

// The capability used before the answer is read.

func usedFirst(m memapi.Mechanism) error {
	vb, err := memapi.RequireVirtualBacking(m)
	_, rerr := vb.Reserve(ctx, memapi.ReserveRequest{Size: 1}) // want `vb is used before the error of RequireVirtualBacking \(line 34\) is checked`
	return errors.Join(err, rerr)
}

func usedOnOneBranch(m memapi.Mechanism, eager bool) (memapi.Bytes, error) {
	sm, ok := m.AsSharedMapping()
	if eager {
		n, err := sm.ViewCount(nil) // want `sm is used before the ok of AsSharedMapping`
		return memapi.Bytes(n), err
	}
	if !ok {
		return 0, errors.ErrUnsupported
	}
	n, err := sm.ViewCount(nil)
	return memapi.Bytes(n), err
}

// The answer read first: the seed's "let Some(backing) = ... else fallback".

func fallback(m memapi.Mechanism) (*memapi.Reservation, error) {
	vb, err := memapi.RequireVirtualBacking(m)
	if err != nil {
		return nil, err
	}
	return vb.Reserve(ctx, memapi.ReserveRequest{Size: 1})
}

func accessor(m memapi.Mechanism) bool {
	if sm, ok := m.AsSharedMapping(); ok {
		_, _ = sm.ViewCount(nil)
		return true
	}
	return false
}

func passedOn(m memapi.Mechanism) (memapi.VirtualBacking, error) {
	vb, err := memapi.RequireVirtualBacking(m)
	return vb, err
}

func onlyTheAnswer(m memapi.Mechanism) bool {
	_, ok := m.AsVirtualBacking()
	return ok
}

// The escape, with its reason.
func known(m memapi.Mechanism) memapi.VirtualBacking {
	//memvet:allow m is the cpu mechanism, which always offers VirtualBacking
	vb, _ := memapi.RequireVirtualBacking(m)
	return vb
}
