package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Paging configures the paged baseline: a block-paged KV cache in the
// manner of vLLM's PagedAttention.
type Paging struct {
	// BlockTokens is the tokens per block (vLLM's default is 16).
	BlockTokens int
	// PrefixTokens is the shared system prompt: prompts at least this
	// long share its full blocks (PrefixTokens / BlockTokens of them),
	// stored once for the whole run; the rest of the prefix, a partial
	// block, is each request's own. 0: no sharing.
	PrefixTokens int
	// Watermark is the fraction of the blocks that admission leaves free
	// for the running requests to grow into (vLLM's default is 0.01).
	Watermark float64
}

// PagedBaseline replays w on a block-paged KV cache: the budget is cut into
// blocks of p.BlockTokens tokens, and a request holds the blocks its tokens
// so far fill, one more each time a token crosses into a new block. Blocks
// are allocated and freed one at a time, so memory is block-granular with
// no address stability: a request's KV is scattered over blocks and
// attention must read it through a block table.
//
// Each iteration, like vLLM's scheduler: waiting requests are admitted
// first come, first served (preempted ones first, in arrival order) while
// the free blocks, less the watermark, cover their tokens; then every
// running request appends one token, oldest first, and when no block is
// free for it the newest running request is preempted (its blocks freed,
// its tokens recomputed when it is admitted again), itself if it is the
// newest. A request whose own tokens can never fit the blocks is rejected.
func PagedBaseline(w Workload, p Paging) Figures {
	f := Figures{Requests: len(w.Reqs)}
	bt := max(p.BlockTokens, 1)
	blockBytes := memapi.Bytes(bt) * w.BytesPerToken
	total := int(w.KVBudget / blockBytes)
	shared := 0
	if p.PrefixTokens > 0 && p.PrefixTokens/bt < total {
		shared = p.PrefixTokens / bt
	}
	free := total - shared
	watermark := int(p.Watermark*float64(total) + 0.999999)
	blocksFor := func(tokens int) int { return (tokens + bt - 1) / bt }

	type preq struct {
		q       Request
		offset  int // prefix tokens in shared blocks
		own     int // tokens in its own blocks: stored, or to recompute when preempted
		blocks  int
		left    int
		resumed bool
	}
	var (
		now     time.Duration
		next    int
		waiting []*preq
		running []*preq
	)
	byArrival := func(a, b *preq) int { return a.q.ID - b.q.ID }
	preempt := func(v *preq) {
		free += v.blocks
		v.blocks = 0
		v.resumed = true
		running = slices.DeleteFunc(running, func(r *preq) bool { return r == v })
		waiting = append(waiting, v)
		slices.SortStableFunc(waiting, byArrival)
	}
	for next < len(w.Reqs) || len(waiting) > 0 || len(running) > 0 {
		for next < len(w.Reqs) && w.Reqs[next].Arrival <= now {
			q := w.Reqs[next]
			next++
			r := &preq{q: q, own: q.Prompt, left: q.Gen}
			if shared > 0 && q.Prompt >= p.PrefixTokens {
				r.offset = shared * bt
				r.own = q.Prompt - r.offset
			}
			if blocksFor(q.Context()-r.offset) > total-shared {
				f.Rejected++
				continue
			}
			waiting = append(waiting, r)
		}
		if len(running) == 0 && len(waiting) == 0 {
			now = w.Reqs[next].Arrival
			continue
		}
		prefill := 0
		for len(waiting) > 0 {
			r := waiting[0]
			need := blocksFor(r.own)
			if len(running) > 0 && free-need < watermark || need > free {
				break
			}
			free -= need
			r.blocks = need
			if r.resumed {
				prefill += r.own
			} else {
				prefill += r.q.Prompt
			}
			running = append(running, r)
			waiting = waiting[1:]
		}
		slices.SortStableFunc(running, byArrival)
		if len(running) == 0 {
			if len(waiting) > 0 {
				// Every request left fits the blocks alone: blocks were lost.
				panic(fmt.Sprintf("paged baseline: request %d waits for %d blocks with %d of %d free and nothing running", waiting[0].q.ID, blocksFor(waiting[0].own), free, total-shared))
			}
			continue
		}
		d := w.Step.Duration(len(running), prefill)
		f.step(len(running), d)
		now += d
		// Grow, oldest first; a preempted request leaves the list.
		for i := 0; i < len(running); i++ {
			r := running[i]
			if r.left == 0 {
				continue
			}
			if r.own+1 > r.blocks*bt {
				for free == 0 && running[len(running)-1] != r {
					preempt(running[len(running)-1])
				}
				if free == 0 {
					if len(running) == 1 {
						// Its tokens fit the blocks alone: blocks were lost.
						panic(fmt.Sprintf("paged baseline: request %d cannot grow alone: %d blocks held, %d free of %d", r.q.ID, r.blocks, free, total-shared))
					}
					preempt(r) // the newest: it gives its own blocks back
					break
				}
				free--
				r.blocks++
			}
			r.own++
			r.left--
			f.Tokens++
		}
		states := memapi.Bytes(shared*bt) * w.BytesPerToken
		held := shared
		for _, r := range running {
			states += memapi.Bytes(r.own) * w.BytesPerToken
			held += r.blocks
		}
		f.kv(states, memapi.Bytes(held)*blockBytes, d)
		running = slices.DeleteFunc(running, func(r *preq) bool {
			if r.left > 0 {
				return false
			}
			free += r.blocks
			f.Served++
			return true
		})
	}
	f.finish(now)
	return f
}
