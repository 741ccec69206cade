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

// OverBudgetError is an allocation the governor could not back even after
// the pool trimmed its cache: the pool's figures at the time and the
// governor's own error.
type OverBudgetError struct {
	Wanted   memapi.Bytes // the request
	Grow     memapi.Bytes // the segment the pool tried to add
	Segments memapi.Bytes // bytes the pool held
	InUse    memapi.Bytes // of which in blocks in use
	Cached   memapi.Bytes // of which cached
	Trimmed  memapi.Bytes // bytes the pool released before failing
	Err      error        // the binding's error (an over-budget error)
}

func (e *OverBudgetError) Error() string {
	return fmt.Sprintf("pool: over budget: %d bytes wanted (segment of %d) with %d held (%d in use, %d cached, %d trimmed): %v",
		e.Wanted, e.Grow, e.Segments, e.InUse, e.Cached, e.Trimmed, e.Err)
}

// Unwrap reports memapi.ErrOverBudget and the binding's error.
func (e *OverBudgetError) Unwrap() []error { return []error{memapi.ErrOverBudget, e.Err} }

func invalidSize(n memapi.Bytes, detail string) error {
	return &memapi.Error{Op: "pool.Alloc", Kind: memapi.ErrInvalidSize, Wanted: n, Detail: detail}
}
