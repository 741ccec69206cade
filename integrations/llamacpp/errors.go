package llamacpp

import (
	"errors"
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
)

var (
	// ErrNotLoaded: Init has not loaded llama.cpp.
	ErrNotLoaded = errors.New("llamacpp: llama.cpp is not loaded (Init)")
	// ErrModel: llama.cpp refused a model file that passed the GGUF check
	// (an architecture or tensor it does not know, say); the error carries
	// its log line.
	ErrModel = errors.New("llamacpp: llama.cpp refused the model")
	// ErrContext: llama.cpp could not create a context.
	ErrContext = errors.New("llamacpp: llama.cpp could not create the context")
	// ErrContextFull: a decode would need more cells than the context's
	// n_ctx.
	ErrContextFull = errors.New("llamacpp: context full")
	// ErrToken: a token id outside the model's vocabulary.
	ErrToken = errors.New("llamacpp: token out of range")
	// ErrDecode: llama_decode failed.
	ErrDecode = errors.New("llamacpp: decode failed")
	// ErrLayout: a KV tensor is not one row per cell (the layout this
	// package grows), so it cannot be placed.
	ErrLayout = errors.New("llamacpp: unsupported KV tensor layout")
)

// OverBudgetError says that a context's KV cache could not get the memory
// it needs from the governor: at open, when its whole n_ctx could never
// fit the authority's capacity; at a decode, when growing its tensors was
// refused within the caller's deadline. Nothing changed: the context keeps
// the rows it had.
type OverBudgetError struct {
	Context   string       // the context's holder
	Rows      int          // rows each tensor needed
	Wanted    memapi.Bytes // KV bytes the context would hold
	Committed memapi.Bytes // KV bytes it holds
	Capacity  memapi.Bytes // the authority's capacity
	Free      memapi.Bytes // its free bytes when refused
	Err       error        // the governor's or pmm's error (nil at open)
}

func (e *OverBudgetError) Error() string {
	s := fmt.Sprintf("llamacpp: over budget: context %s needs %d bytes of KV (%d rows per tensor), holds %d; authority capacity %d, free %d",
		e.Context, e.Wanted, e.Rows, e.Committed, e.Capacity, e.Free)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap reports memapi.ErrOverBudget and the underlying error.
func (e *OverBudgetError) Unwrap() []error {
	if e.Err != nil {
		return []error{memapi.ErrOverBudget, e.Err}
	}
	return []error{memapi.ErrOverBudget}
}
