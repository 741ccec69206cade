// Package devctx is what the host-side device contexts share (the CPU
// mechanism's and the plugin loader's): the book of a context's open
// streams, which decides when the context may close.
package devctx

import (
	"fmt"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
)

// Streams is a device context's open streams of type S. The zero value is
// an open context without streams; it is safe for concurrent use.
type Streams[S comparable] struct {
	mu     sync.Mutex
	open   map[S]struct{}
	closed bool
}

// Open makes a stream with create and books it, holding the book's lock
// while create runs. After Close it fails with ErrClosed (of mechanism
// mech) without calling create.
func (b *Streams[S]) Open(mech memapi.MechanismID, create func() (S, error)) (S, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		var none S
		return none, &memapi.Error{Op: "DeviceContext.NewStream", Kind: memapi.ErrClosed, Mechanism: mech}
	}
	s, err := create()
	if err != nil {
		return s, err
	}
	if b.open == nil {
		b.open = map[S]struct{}{}
	}
	b.open[s] = struct{}{}
	return s, nil
}

// Closed forgets s, a stream that closed.
func (b *Streams[S]) Closed(s S) {
	b.mu.Lock()
	delete(b.open, s)
	b.mu.Unlock()
}

// Close closes the context: it fails with ErrInUse (of mechanism mech)
// while streams are open; a second Close returns nil.
func (b *Streams[S]) Close(mech memapi.MechanismID) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.open); n > 0 {
		return &memapi.Error{Op: "DeviceContext.Close", Kind: memapi.ErrInUse, Mechanism: mech,
			Detail: fmt.Sprintf("%d streams are open", n)}
	}
	b.closed = true
	return nil
}
