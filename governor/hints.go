package governor

import (
	"sync"
	"sync/atomic"
)

// hints are an authority's grants whose lease was refunded whole without
// the lock (Lease.Refund), which Reserve issues again without the lock
// (grant.reissue). They are only hints, read without the lock: the record's
// word says whether it can be issued, and a hint may name a record in use,
// or one whose use ended under the lock since (authority.retireLocked).
//
// The slot serves one stream of reservations: the grant refunded last is
// the one the next Reserve takes, in a load and a swap, with nothing else
// shared. When Reserve finds the slot's grant in use, another stream runs
// on the authority at the same time, and reading a grant that another core
// writes would cost each of them a cache miss per call: the slot then holds
// pooledHint, and refunded grants go to the pool, which keeps them per P,
// so each goroutine finds one refunded on its own P. A reservation that
// takes the lock empties the slot again (retry), so a single stream gets
// its slot back.
type hints struct {
	slot atomic.Pointer[grant]
	pool sync.Pool
}

// pooledHint and closedHint are records never refunded, never issued: the
// slot holds pooledHint while streams run at once, and closedHint once the
// authority is closed (nothing is issued again without the lock, and a
// refund without the lock takes the lock instead).
var pooledHint, closedHint grant

// place reports where a refund of gr without the lock leaves gr: in the
// slot, which holds it already or is empty (install: the refund stores gr
// there after its swap, keep), or in the pool (toPool); ok is false when
// the authority is closed, and the refund takes the lock.
func (hs *hints) place(gr *grant) (install, toPool, ok bool) {
	switch hs.slot.Load() {
	case gr:
		return false, false, true
	case nil:
		return true, false, true
	case &closedHint:
		return false, false, false
	}
	return false, true, true
}

// keep leaves gr where place said, once its refund swapped the word: a
// slot taken since (by another refund, or by Close) sends it to the pool.
func (hs *hints) keep(gr *grant, install, toPool bool) {
	if install && hs.slot.CompareAndSwap(nil, gr) {
		return
	}
	if install || toPool {
		hs.pool.Put(gr)
	}
}

// contended makes the slot pooledHint, if it still holds inUse: a grant
// Reserve found in use, so another stream runs.
func (hs *hints) contended(inUse *grant) { hs.slot.CompareAndSwap(inUse, &pooledHint) }

// retry empties the slot if it holds pooledHint: called by reservations
// that take the lock, so a single stream gets its slot back (and streams
// that still run at once make it pooledHint again at their next Reserve).
func (hs *hints) retry() {
	if hs.slot.Load() == &pooledHint {
		hs.slot.CompareAndSwap(&pooledHint, nil)
	}
}

// drop empties the slot if it holds gr. Called with the authority's mutex
// held, when gr's use ended under it. (The pool may still hold gr: its
// word, no longer refunded, keeps Reserve from issuing it from there.)
func (hs *hints) drop(gr *grant) {
	if hs.slot.Load() == gr {
		hs.slot.Store(nil)
	}
}

// close makes the slot closedHint. Grants left in the pool were refunded
// before, and are settled by Close, so nothing issues them again.
func (hs *hints) close() { hs.slot.Store(&closedHint) }

// refunded returns the slot's grant when its lease was refunded whole and
// not settled yet, or nil.
func (hs *hints) refunded() *grant {
	if gr := hs.slot.Load(); gr != nil && gr.state.Load()>>stateShift == stateRefunded {
		return gr
	}
	return nil
}
