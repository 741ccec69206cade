package pool

import (
	"errors"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
)

// ErrDoubleFree is the kind of a Free of a block already freed.
var ErrDoubleFree = errors.New("pool: block already freed")

// ErrForeignBlock is the kind of a Free of a block another pool made, or of
// a zero Block; it is also memapi.ErrForeignHandle.
var ErrForeignBlock = fmt.Errorf("pool: foreign block: %w", memapi.ErrForeignHandle)

func invalidSize(n memapi.Bytes, detail string) error {
	return &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrInvalidSize, Wanted: n, Detail: detail}
}

// OverBudgetError is Alloc's failure over budget: the pool's figures when
// its growth failed, after it trimmed its own cache, beside the cause. Err
// is the governor's *governor.OverBudgetError (with the ledger's figures)
// when the governor refused the growth, or the context's error when the
// growth ran past the pool's wait in the mechanism's call. errors.Is
// matches memapi.ErrOverBudget and the cause; errors.As finds the
// governor's error through it.
type OverBudgetError struct {
	Authority memapi.AuthorityID
	Request   memapi.Bytes // the allocation asked for
	Segment   memapi.Bytes // the segment (or region growth, or recommit) the pool tried to add
	Held      memapi.Bytes // bytes the pool held from its binding at the failure
	InUse     memapi.Bytes // of Held, in blocks in use
	Cached    memapi.Bytes // of Held, cached
	Trimmed   memapi.Bytes // bytes the pool gave back (its Reclaim) while the growth waited
	Err       error
}

func (e *OverBudgetError) Error() string {
	msg := fmt.Sprintf("pool.Alloc: over budget [pool: request %d, segment %d, held %d (%d in use, %d cached), %d trimmed] [authority %s]",
		e.Request, e.Segment, e.Held, e.InUse, e.Cached, e.Trimmed, e.Authority)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the equivalent *memapi.Error and the cause.
func (e *OverBudgetError) Unwrap() []error {
	me := &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrOverBudget, Authority: e.Authority, Wanted: e.Segment, Detail: "the pool could not grow"}
	if e.Err == nil {
		return []error{me}
	}
	return []error{me, e.Err}
}
