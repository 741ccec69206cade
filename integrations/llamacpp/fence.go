package llamacpp

import (
	"context"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// decodeFence is the fence of a decode's llama_decode calls: recorded on
// every KV region of the context before the first, completed when the
// last has returned (the CPU backend is synchronous). A release of the
// regions (a close, a reset, a preemption, the decode's own shrink) is
// queued behind it by pmm.
type decodeFence struct {
	done chan struct{}
	once sync.Once
}

var _ memapi.Fence = (*decodeFence)(nil)

func newDecodeFence() *decodeFence { return &decodeFence{done: make(chan struct{})} }

// complete completes the fence; a second call does nothing.
func (f *decodeFence) complete() { f.once.Do(func() { close(f.done) }) }

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
