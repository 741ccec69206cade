package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/pool"
)

// pressureRounds follows the governor's pressure on the device from its
// events: a round is a pressure event (a reservation short of bytes) and
// the tickets handed out for it, in order. It checks that caches come
// first: every round asks the activation pool first while the pool holds
// anything, and no round of another holder asks the second model or the
// KV store while the pool's idle cache (no block in use or pending, so all
// of it can be given back) covers the shortfall.
//
// Rounds on one authority run one after another here: reservations on the
// device are made by the run's loop alone (a holder's Reclaim reserves on
// the host at most, the second model's offload), so a round's tickets are
// the ones between its pressure event and the next.
type pressureRounds struct {
	mu   sync.Mutex
	auth memapi.AuthorityID
	pool func() pool.Stats // nil: the run has no workspace

	cur        *round
	rounds     int // device pressure rounds
	poolFirst  int // rounds whose first ticket went to the pool
	poolAlone  int // rounds the pool's cache answered alone
	poolEmpty  int // rounds that asked another holder first while the pool held nothing
	noTicket   int // rounds that refunds on their way answered, no ticket issued
	poolFreed  memapi.Bytes
	violations []string
	nviol      int
}

type round struct {
	at        time.Duration // simulated time since the clock's epoch
	requester governor.HolderID
	short     memapi.Bytes
	held      memapi.Bytes // the pool's segments at the pressure event
	idle      memapi.Bytes // its cache when nothing is in use or pending, else 0
	asked     []governor.HolderID
}

// setPool gives the rounds the pool's figures.
func (p *pressureRounds) setPool(stats func() pool.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pool = stats
}

// event takes a governor event (the stack's hook forwards every one).
func (p *pressureRounds) event(e governor.Event) {
	if e.Authority != p.auth {
		return
	}
	switch e.Kind {
	case governor.EventPressure:
		r := &round{at: e.Time.Sub(simEpoch), requester: e.Holder, short: e.Bytes}
		p.mu.Lock()
		stats := p.pool
		p.mu.Unlock()
		if stats != nil {
			// The pool's figures are taken outside the ledger's locks (the
			// hook runs with none held) and outside its own, which are not
			// held across a growth.
			st := stats()
			r.held = st.Segments
			if st.InUse == 0 && st.Pending == 0 {
				r.idle = st.Cached
			}
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.closeLocked()
		p.cur = r
		p.rounds++
	case governor.EventTicket:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.cur != nil {
			p.cur.asked = append(p.cur.asked, e.Holder)
		}
	case governor.EventReclaimed:
		if e.Holder == holderPool {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.poolFreed += e.Bytes
		}
	}
}

// closeLocked judges the round in progress.
func (p *pressureRounds) closeLocked() {
	r := p.cur
	p.cur = nil
	if r == nil {
		return
	}
	switch {
	case len(r.asked) == 0:
		p.noTicket++
		return
	case r.asked[0] == holderPool:
		p.poolFirst++
		if len(r.asked) == 1 {
			p.poolAlone++
		}
	case r.held == 0:
		p.poolEmpty++
	default:
		p.violate(r, "pressure of %s (short %s): %s was asked first while the activation pool held %s", r.requester, fmtBytes(r.short), r.asked[0], fmtBytes(r.held))
	}
	if r.requester == holderPool || r.idle < r.short {
		return
	}
	for _, h := range r.asked {
		if h == holderKV || h == holderSecond {
			p.violate(r, "pressure of %s (short %s): %s was asked while the activation pool's idle cache of %s covered it", r.requester, fmtBytes(r.short), h, fmtBytes(r.idle))
			return
		}
	}
}

func (p *pressureRounds) violate(r *round, format string, args ...any) {
	p.nviol++
	if len(p.violations) < 20 {
		p.violations = append(p.violations, fmt.Sprintf("t=%.3fs: ", r.at.Seconds())+fmt.Sprintf(format, args...))
	}
}

// pressureFigures are the rounds' counts once the run ended.
type pressureFigures struct {
	Rounds    int          // device pressure rounds
	PoolFirst int          // whose first ticket went to the pool
	PoolAlone int          // of those, answered by the pool alone
	PoolEmpty int          // that asked others while the pool held nothing
	NoTicket  int          // that refunds on their way answered
	PoolFreed memapi.Bytes // what the pool's Reclaim gave back, from the governor's events

	Violations   int
	ViolationLog []string
}

// figures ends the round in progress and returns the counts.
func (p *pressureRounds) figures() pressureFigures {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
	return pressureFigures{Rounds: p.rounds, PoolFirst: p.poolFirst, PoolAlone: p.poolAlone, PoolEmpty: p.poolEmpty, NoTicket: p.noTicket, PoolFreed: p.poolFreed,
		Violations: p.nviol, ViolationLog: append([]string(nil), p.violations...)}
}
