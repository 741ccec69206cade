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
