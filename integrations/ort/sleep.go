package ort

import (
	"context"
	"errors"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// ErrAsleep is what Step and Prefill of an asleep sequence fail with:
// Wake it first.
var ErrAsleep = errors.New("ort: the sequence is asleep (Wake first)")

// Sleep moves the sequence's KV cache to host, a binding of the same
// manager on another authority (the host tier): each cache Region's
// committed bytes are copied into a host Buffer and decommitted, every
// address kept (pmm.Region.Offload: the host tier charged before the copy,
// the device released after it), so the session's bound tensors stay valid
// and Wake puts the bytes back behind them. Asleep, Step and Prefill fail
// with ErrAsleep, and the sequence holds none of its KV on the device.
//
// It waits for no step: a Step or Prefill in progress makes it fail with
// memapi.ErrInUse. It is one transaction: should a Region's move fail, the
// ones moved are restored and the error returned, the sequence awake;
// should a restore fail too, what it could not restore stays asleep (Wake
// retries it). Only a KVGrow sequence of its own sleeps (memapi.ErrUnsupported
// otherwise: a preallocated cache has nothing to give back but all of it, a
// concat one lives in ONNX Runtime's buffers, a batch's in its slots).
// Sleeping an asleep sequence does nothing; closing one drops its host
// copies.
func (q *Sequence) Sleep(ctx context.Context, host *pmm.Binding) error {
	const op = "ort.Sequence.Sleep"
	if q.d.mode != KVGrow || q.batch != nil {
		return memapi.Errorf(op, memapi.ErrUnsupported, "only a KVGrow sequence of its own sleeps")
	}
	if host == nil {
		return memapi.Errorf(op, memapi.ErrNilHandle, "no host binding")
	}
	if asleep, err := q.beginMove(op); err != nil || asleep {
		if asleep {
			q.mu.Lock()
			keep := q.sleeping
			q.mu.Unlock()
			q.endMove(keep)
		}
		return err
	}
	var moved []*pmm.Offloaded
	for _, r := range q.region {
		o, err := r.Offload(ctx, host)
		if o != nil {
			moved = append(moved, o)
		}
		if err != nil {
			uctx := context.WithoutCancel(ctx)
			var left []*pmm.Offloaded
			for i := len(moved) - 1; i >= 0; i-- {
				if rerr := moved[i].Restore(uctx); rerr != nil {
					err = errors.Join(err, rerr)
					left = append(left, moved[i])
				}
			}
			q.endMove(left)
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	q.endMove(moved)
	return nil
}

// Wake brings an asleep sequence's KV cache back: each Region's bytes are
// committed again at their addresses (charged with pressure, bounded by
// ctx) and copied back, and the host copies freed (pmm.Offloaded.Restore).
// Should a restore fail, the error is returned and what was not restored
// stays asleep, its bytes safe in the host tier: Wake again retries it. A
// Step or Prefill in progress makes it fail with memapi.ErrInUse; waking an
// awake sequence does nothing.
func (q *Sequence) Wake(ctx context.Context) error {
	const op = "ort.Sequence.Wake"
	if _, err := q.beginMove(op); err != nil {
		return err
	}
	q.mu.Lock()
	left := q.sleeping
	q.mu.Unlock()
	for len(left) > 0 {
		if err := left[0].Restore(ctx); err != nil {
			q.endMove(left)
			return fmt.Errorf("%s: %w", op, err)
		}
		left = left[1:]
	}
	q.endMove(nil)
	return nil
}

// Asleep reports whether the sequence is asleep (Sleep, not yet Wake).
func (q *Sequence) Asleep() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.asleep
}

// beginMove holds the sequence's steps off for a Sleep or a Wake, as a
// step holds the others off, and says whether it is asleep.
func (q *Sequence) beginMove(op string) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return false, memapi.Errorf(op, memapi.ErrClosed, "sequence is closed")
	case q.stepping:
		return false, memapi.Errorf(op, memapi.ErrInUse, "a Step, Prefill, Sleep or Wake is running")
	}
	q.stepping = true
	return q.asleep, nil
}

// endMove ends a Sleep or a Wake: the sequence is asleep while host
// copies are left (sleeping), awake otherwise. Were it closed meanwhile,
// the host copies are dropped and what Close left to the move is
// released, as endStep does for a step.
func (q *Sequence) endMove(sleeping []*pmm.Offloaded) {
	q.mu.Lock()
	closed := q.closed
	if closed {
		q.sleeping, q.asleep = nil, false
	} else {
		q.sleeping, q.asleep = sleeping, len(sleeping) != 0
	}
	q.mu.Unlock()
	if closed {
		_ = dropSleeping(sleeping)
	}
	_ = q.endStep(false, 0)
}

// dropSleeping discards host copies of a sequence being closed: their
// ranges are freed with it.
func dropSleeping(offs []*pmm.Offloaded) error {
	var errs []error
	for _, o := range offs {
		if err := o.Discard(); err != nil && !errors.Is(err, memapi.ErrReleased) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
