package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// A preempted context's KV cache can move instead of being dropped: with
// ContextOptions.OffloadTo, Reclaim copies every KV tensor's committed rows
// to the host tier and decommits them (pmm.Region.Offload: the host tier
// charged before the copy, the device released after it), keeping
// llama.cpp's cells, and the context's next call copies them back
// (Offloaded.Restore) before it decodes: no token is recomputed. The
// policy is the holder's: it offloads when the host tier takes the bytes,
// and recomputes (drops the cells) when it does not.

// offloadKV moves the KV cache to the host tier (c.mu held). It returns
// the device bytes given back, and false, having restored what moved,
// when a move failed: the caller then drops the cells instead.
func (c *Context) offloadKV(ctx context.Context) (memapi.Bytes, bool) {
	if c.offloadTo == nil {
		return 0, false
	}
	start := time.Now()
	var moved []*pmm.Offloaded
	var n memapi.Bytes
	for _, t := range c.tensors {
		o, err := t.region.Offload(ctx, c.offloadTo)
		if o != nil {
			moved = append(moved, o)
			n += o.Bytes()
		}
		if err != nil {
			uctx := context.WithoutCancel(ctx)
			var left []*pmm.Offloaded
			for i := len(moved) - 1; i >= 0; i-- {
				if moved[i].Restore(uctx) != nil {
					left = append(left, moved[i])
				}
			}
			if len(left) == 0 {
				return 0, false
			}
			// What could not come back stays in the host tier: the next
			// call restores it before it decodes.
			c.preempted = left
			return 0, true
		}
	}
	c.preempted = moved
	c.stats.Preemptions++
	c.stats.Offloads++
	c.stats.Moved += n
	took := time.Since(start)
	c.stats.MoveTime += took
	c.m.emit(MemoryEvent{Kind: "offload", Holder: c.holder, Authority: c.authority(), Bytes: n, Start: start, Took: took})
	return n, true
}

// restoreKV copies a preempted KV cache back from the host tier before a
// call uses it (c.mu held): each region's rows are committed again,
// charged through the governor within ctx, and copied back. On a failure
// the error is returned and what was not restored stays in the host tier
// for the next call; the context is otherwise as it was.
func (c *Context) restoreKV(ctx context.Context, op string) error {
	if len(c.preempted) == 0 {
		return nil
	}
	start := time.Now()
	var n memapi.Bytes
	for len(c.preempted) > 0 {
		o := c.preempted[0]
		if err := o.Restore(ctx); err != nil {
			var ob *OverBudgetError
			if errors.As(err, &ob) {
				return err
			}
			return fmt.Errorf("%s: context %s: restoring its KV cache from the host tier: %w", op, c.holder, err)
		}
		n += o.Bytes()
		c.preempted = c.preempted[1:]
	}
	c.preempted = nil
	c.stats.Restores++
	c.stats.Moved += n
	took := time.Since(start)
	c.stats.MoveTime += took
	c.m.emit(MemoryEvent{Kind: "restore", Holder: c.holder, Authority: c.authority(), Bytes: n, Start: start, Took: took})
	return nil
}
