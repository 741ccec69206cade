package llamacpp

import (
	"context"

	"github.com/memgen/memgen/generated/memapi"
)

// decodeFence is the fence of one llama_decode: recorded on every KV
// region of the context before the call, completed when it returns. A
// release of the regions (a close, a reset, a preemption) is queued behind
// it by pmm.
type decodeFence struct{ done chan struct{} }

var _ memapi.Fence = (*decodeFence)(nil)

func newDecodeFence() *decodeFence { return &decodeFence{done: make(chan struct{})} }

func (f *decodeFence) complete() { close(f.done) }

func (f *decodeFence) Done() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

func (f *decodeFence) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *decodeFence) Ready() <-chan struct{} { return f.done }
