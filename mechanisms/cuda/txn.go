package cuda

import (
	"log/slog"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// txn is a sequence of driver calls on the device thread that either all
// take effect or none does: each successful step registers its undo, and the
// first failing step runs the undos in reverse order. That is how every
// multi-call operation (commit k chunks, copy-on-write, release) leaves the
// previous state intact when the driver refuses part of it.
type txn struct {
	t    *driver.Table
	log  *slog.Logger
	undo []func()
}

func (m *Mechanism) txn(t *driver.Table) *txn { return &txn{t: t, log: m.log} }

// step checks r for call; on failure it rolls back and returns the error,
// on success it registers undo (which may be nil).
func (x *txn) step(call string, r driver.Result, undo func()) error {
	if err := check(x.t, call, r); err != nil {
		x.rollback()
		return err
	}
	if undo != nil {
		x.undo = append(x.undo, undo)
	}
	return nil
}

// onRollback registers an undo that makes no driver call.
func (x *txn) onRollback(undo func()) { x.undo = append(x.undo, undo) }

// rollback undoes every registered step, newest first.
func (x *txn) rollback() {
	for i := len(x.undo) - 1; i >= 0; i-- {
		x.undo[i]()
	}
	x.undo = nil
}

// quiet runs an undo's driver call; a failure there cannot be undone in
// turn, so it is logged.
func (x *txn) quiet(call string, r driver.Result) {
	if r != driver.Success {
		x.log.Warn("cuda: rollback step failed", "call", call, "code", x.t.ErrorName(r))
	}
}

// settle waits for the device's queued work before the transaction unmaps
// anything (see device.settle); on failure it rolls back.
func (x *txn) settle(d *device) error {
	if err := d.settle(x.t); err != nil {
		x.rollback()
		return err
	}
	return nil
}
