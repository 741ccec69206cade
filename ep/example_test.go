package ep_test

import (
	"context"
	"fmt"
	"time"

	"github.com/memgen/memgen/ep"
)

// weights is a layer's state for one buffer, as pmm's is: the transitions
// of its owning handle (ep.Releaser).
type weights struct{}

func (weights) Closed()  {}
func (weights) Pending() { fmt.Println("lease marked pending-free") }
func (weights) Free(context.Context) error {
	fmt.Println("freed by its mechanism, lease refunded")
	return nil
}

// A buffer used by device work is closed at once; its memory is freed only
// after the work's fence completes.
func Example() {
	c := ep.NewContext(&devCtx{}, ep.Options{})
	work := newFence(false) // a fence recorded after a kernel that reads the buffer

	buf, _ := c.Own("weights", weights{})
	_ = buf.RecordUse(work)
	_ = buf.Close() // returns at once
	fmt.Println("live allocations:", c.Live())

	work.Complete()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Close(ctx, true); err != nil { // waits for the free
		fmt.Println(err)
	}
	fmt.Println("live allocations:", c.Live())
	// Output:
	// lease marked pending-free
	// live allocations: 1
	// freed by its mechanism, lease refunded
	// live allocations: 0
}
