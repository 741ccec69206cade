package ort

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
)

// runFence is the fence of one ONNX Runtime Run over a sequence's cache:
// recorded on every cache handle before the Run starts, completed when it
// has returned. A handle closed meanwhile is released only after it, so a
// Sequence closed from another goroutine never has its memory unmapped
// under a running step.
type runFence struct{ done chan struct{} }

var _ memapi.Fence = (*runFence)(nil)

func newRunFence() *runFence { return &runFence{done: make(chan struct{})} }

// complete marks the Run finished; call it once.
func (f *runFence) complete() { close(f.done) }

// Done reports whether the Run has returned.
func (f *runFence) Done() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the Run has returned or ctx ends.
func (f *runFence) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready returns a channel closed when the Run has returned.
func (f *runFence) Ready() <-chan struct{} { return f.done }
