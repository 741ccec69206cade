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

// LimitError refuses a context option beyond what the model allows,
// before anything is allocated; it matches memapi.ErrInvalidSize.
type LimitError struct {
	Field  string // the option: "n_ctx"
	Value  int    // what was asked
	Limit  int    // what the model allows
	Reason string // where the limit comes from
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("llamacpp: %s %d beyond %d: %s", e.Field, e.Value, e.Limit, e.Reason)
}

// Unwrap reports memapi.ErrInvalidSize.
func (e *LimitError) Unwrap() error { return memapi.ErrInvalidSize }

// WaitError says that a decode's KV growth was still waiting for memory
// when the caller's context ended: errors.Is matches the context's error
// (context.DeadlineExceeded, context.Canceled), not memapi.ErrOverBudget.
// Nothing changed: the context keeps the rows it had.
type WaitError struct {
	Context   string       // the context's holder
	Rows      int          // rows each tensor needed
	Wanted    memapi.Bytes // KV bytes the context would hold
	Committed memapi.Bytes // KV bytes it holds
	Free      memapi.Bytes // the authority's free bytes when it gave up
	Err       error        // the context's cause
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("llamacpp: context %s gave up waiting for %d bytes of KV (%d rows per tensor; holds %d, %d free): %v",
		e.Context, e.Wanted, e.Rows, e.Committed, e.Free, e.Err)
}

func (e *WaitError) Unwrap() error { return e.Err }

// OverBudgetError says that a context's KV cache could not get the memory
// it needs from the governor: at open, when its whole n_ctx and the
// model's weights could never fit the authority's capacity together; at a
// decode, when growing its tensors was refused (a wait that ended with the
// caller's context is a *WaitError instead). Nothing changed: the context
// keeps the rows it had.
type OverBudgetError struct {
	Context   string       // the context's holder
	Rows      int          // rows each tensor needed
	Wanted    memapi.Bytes // KV bytes the context would hold
	Committed memapi.Bytes // KV bytes it holds
	Weights   memapi.Bytes // the model's weights, charged beside it (at open)
	Compute   memapi.Bytes // the context's compute and output buffers, charged beside it (at open)
	Capacity  memapi.Bytes // the authority's capacity
	Free      memapi.Bytes // its free bytes when refused
	Err       error        // the governor's or pmm's error (nil at open)
}

func (e *OverBudgetError) Error() string {
	s := fmt.Sprintf("llamacpp: over budget: context %s needs %d bytes of KV (%d rows per tensor), holds %d", e.Context, e.Wanted, e.Rows, e.Committed)
	if e.Weights != 0 {
		s += fmt.Sprintf(", beside %d bytes of weights", e.Weights)
		if e.Compute != 0 {
			s += fmt.Sprintf(" and %d of compute buffers", e.Compute)
		}
	}
	s += fmt.Sprintf("; authority capacity %d, free %d", e.Capacity, e.Free)
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
