package pmm_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/pmm"
)

// testLedger is an exact in-memory ledger with fault injection, for testing
// the manager's transactions without the governor. Events are recorded in
// order ("reserve", "commit-grant", "cancel", "pending", "refund").
type testLedger struct {
	mu       sync.Mutex
	capacity memapi.Bytes
	figures
	failReserve, failCommit int              // fail the Nth call (1-based); 0 = never; failCommit < 0: every commit
	failCancel              int              // fail the Nth Cancel (1-based); 0 = never
	failCommitIf            func(n int) bool // fail the commits (numbered from 1) it selects, under the lock
	reserves, commits       int
	cancels                 int
	events                  []string
	onEvent                 func(string)
}

// Quarantined is the part of Charged whose free failed.
type figures struct{ Reserved, Drawn, Charged, Pending, Quarantined memapi.Bytes }

var errInjected = fmt.Errorf("injected ledger fault")

func (l *testLedger) snapshot() figures {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.figures
}

func (l *testLedger) event(s string) {
	l.events = append(l.events, s)
	if l.onEvent != nil {
		l.onEvent(s)
	}
}

func (l *testLedger) Reserve(_ context.Context, r pmm.Request) (pmm.Grant, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reserves++
	if l.failReserve == l.reserves {
		return nil, errInjected
	}
	if l.capacity != 0 && l.Reserved+l.Charged+l.Pending+r.Bytes > l.capacity {
		return nil, &memapi.Error{Op: "testLedger.Reserve", Kind: memapi.ErrOverBudget, Wanted: r.Bytes}
	}
	l.Reserved += r.Bytes
	l.event("reserve")
	return &tGrant{l: l, auth: r.Authority, bytes: r.Bytes}, nil
}

type tGrant struct {
	l      *testLedger
	auth   memapi.AuthorityID
	bytes  memapi.Bytes
	drawn  memapi.Bytes
	closed bool
}

func (g *tGrant) Authority() memapi.AuthorityID { return g.auth }

func (g *tGrant) Draw(n memapi.Bytes) error {
	g.l.mu.Lock()
	defer g.l.mu.Unlock()
	if g.closed {
		return memapi.ErrGrantClosed
	}
	if g.drawn+n > g.bytes {
		return &memapi.Error{Op: "tGrant.Draw", Kind: memapi.ErrGrantExhausted, Wanted: n, Available: g.bytes - g.drawn}
	}
	g.drawn += n
	g.l.Drawn += n
	return nil
}

func (g *tGrant) Undraw(n memapi.Bytes) error {
	g.l.mu.Lock()
	defer g.l.mu.Unlock()
	if g.closed || n > g.drawn {
		return fmt.Errorf("undraw %d of %d (closed %v)", n, g.drawn, g.closed)
	}
	g.drawn -= n
	g.l.Drawn -= n
	return nil
}

func (g *tGrant) Refund(n memapi.Bytes) error { return g.Undraw(n) }

func (g *tGrant) Commit() (pmm.Lease, error) {
	g.l.mu.Lock()
	defer g.l.mu.Unlock()
	g.l.commits++
	if g.l.failCommit == g.l.commits || g.l.failCommit < 0 || (g.l.failCommitIf != nil && g.l.failCommitIf(g.l.commits)) {
		return nil, errInjected
	}
	if g.closed {
		return nil, memapi.ErrGrantClosed
	}
	g.closed = true
	g.l.Reserved -= g.bytes
	g.l.Drawn -= g.drawn
	g.l.Charged += g.drawn
	g.l.event("commit-grant")
	return &tLease{l: g.l, auth: g.auth, charged: g.drawn}, nil
}

func (g *tGrant) Cancel() error {
	g.l.mu.Lock()
	defer g.l.mu.Unlock()
	g.l.cancels++
	if g.l.failCancel == g.l.cancels {
		return errInjected
	}
	if g.closed {
		return memapi.ErrGrantClosed
	}
	if g.drawn != 0 {
		return fmt.Errorf("cancel with %d bytes still drawn", g.drawn)
	}
	g.closed = true
	g.l.Reserved -= g.bytes
	g.l.event("cancel")
	return nil
}

type tLease struct {
	l                      *testLedger
	auth                   memapi.AuthorityID
	charged, pending, quar memapi.Bytes
}

func (s *tLease) Quarantine(n memapi.Bytes) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if n > s.pending+s.charged-s.quar {
		return fmt.Errorf("quarantine %d of %d", n, s.pending+s.charged-s.quar)
	}
	p := min(n, s.pending)
	s.pending -= p
	s.l.Pending -= p
	s.charged += p
	s.l.Charged += p
	s.quar += n
	s.l.Quarantined += n
	s.l.event("quarantine")
	return nil
}

func (s *tLease) RefundQuarantined(n memapi.Bytes) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if n > s.quar {
		return fmt.Errorf("refund %d of %d quarantined", n, s.quar)
	}
	s.quar -= n
	s.l.Quarantined -= n
	s.charged -= n
	s.l.Charged -= n
	s.l.event("refund")
	return nil
}

func (s *tLease) Authority() memapi.AuthorityID { return s.auth }

func (s *tLease) MarkPending(n memapi.Bytes) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if n > s.charged-s.quar {
		return fmt.Errorf("pending %d of %d charged", n, s.charged-s.quar)
	}
	s.charged -= n
	s.pending += n
	s.l.Charged -= n
	s.l.Pending += n
	s.l.event("pending")
	return nil
}

func (s *tLease) Refund(n memapi.Bytes) error {
	s.l.mu.Lock()
	defer s.l.mu.Unlock()
	if n > s.charged+s.pending {
		return fmt.Errorf("refund %d of %d", n, s.charged+s.pending)
	}
	p := min(n, s.pending)
	s.pending -= p
	s.l.Pending -= p
	s.charged -= n - p
	s.l.Charged -= n - p
	s.l.event("refund")
	return nil
}
