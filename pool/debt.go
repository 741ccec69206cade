package pool

import "context"

// A pressure ticket the pool answers short (Reclaim: its blocks were in
// use) leaves a debt while the reservation that asked still waits, which
// is as long as the ticket's context lives (the governor ends it when the
// wait ends). Until then a free that makes a segment wholly free, a huge
// block's or a large block's whose segment is then one free chunk, gives
// that segment back at once (arena.pay, segments.freeHuge) instead of
// caching it, towards the bytes still owed: the waiting reservation is
// served by the refund instead of failing over budget while the pool
// caches what it asked for. A growth of the pool that the freed chunk
// fits takes it instead (the growth wake). What the region's free tail
// and wholly free slabs would give is paid only by the next ticket.

// debt is the rest of a ticket answered short: left bytes, while ctx
// lives.
type debt struct {
	ctx  context.Context
	left uint64
}

// owe records that a ticket whose reservation waits under ctx was
// answered n bytes short.
func (g *segments) owe(ctx context.Context, n uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.settle(0)
	g.owed = append(g.owed, debt{ctx: ctx, left: n})
}

// settle pays n bytes towards the oldest debt still owed, forgetting the
// debts paid or whose reservation stopped waiting; it reports whether
// one took them. The caller holds mu.
func (g *segments) settle(n uint64) (paid bool) {
	live := g.owed[:0]
	for _, d := range g.owed {
		if d.ctx.Err() != nil {
			continue
		}
		if !paid && n > 0 {
			paid = true
			d.left -= min(d.left, n)
		}
		if d.left > 0 {
			live = append(live, d)
		}
	}
	clear(g.owed[len(live):])
	g.owed = live
	return paid
}
