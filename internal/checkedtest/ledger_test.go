package checkedtest

import (
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/fakes"
	"github.com/memgen/memgen/generated/checked"
	"github.com/memgen/memgen/generated/memapi"
)

// grant is a ledger double: a grant with a limit that counts every call, and
// whose Draw or Undraw can be made to fail.
type grant struct {
	authority memapi.AuthorityID

	mu         sync.Mutex
	limit      memapi.Bytes // 0: unlimited
	drawn      memapi.Bytes
	draws      int
	undraws    int
	failDraw   error
	failUndraw error
}

func newGrant(a memapi.AuthorityID, limit memapi.Bytes) *grant {
	return &grant{authority: a, limit: limit}
}

func (g *grant) Authority() memapi.AuthorityID { return g.authority }

func (g *grant) Draw(n memapi.Bytes) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.draws++
	if g.failDraw != nil {
		return g.failDraw
	}
	if g.limit != 0 && g.drawn+n > g.limit {
		return &memapi.Error{Op: "Grant.Draw", Kind: memapi.ErrGrantExhausted, Authority: g.authority, Wanted: n, Available: g.limit - g.drawn}
	}
	g.drawn += n
	return nil
}

func (g *grant) Undraw(n memapi.Bytes) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.undraws++
	if g.failUndraw != nil {
		return g.failUndraw
	}
	if n > g.drawn {
		return memapi.Errorf("Grant.Undraw", memapi.ErrInvalidSize, "undraw %d of %d drawn", n, g.drawn)
	}
	g.drawn -= n
	return nil
}

// state returns what was drawn and how many calls were made.
func (g *grant) state() (drawn memapi.Bytes, draws, undraws int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.drawn, g.draws, g.undraws
}

var _ memapi.Grant = (*grant)(nil)

// account is a ledger double that counts refunds and can refuse them.
type account struct {
	authority memapi.AuthorityID

	mu       sync.Mutex
	refunded memapi.Bytes
	refunds  int
	fail     error
}

func newAccount(a memapi.AuthorityID) *account { return &account{authority: a} }

func (a *account) Authority() memapi.AuthorityID { return a.authority }

func (a *account) Refund(n memapi.Bytes) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refunds++
	if a.fail != nil {
		return a.fail
	}
	a.refunded += n
	return nil
}

func (a *account) state() (refunded memapi.Bytes, refunds int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refunded, a.refunds
}

var _ memapi.Account = (*account)(nil)

// benchLedger is the cheapest honest grant and account: benchmarks use it so
// that the figures show the wrapper's cost rather than the ledger's.
type benchLedger struct {
	authority memapi.AuthorityID
	drawn     atomic.Uint64
}

func (l *benchLedger) Authority() memapi.AuthorityID { return l.authority }
func (l *benchLedger) Draw(n memapi.Bytes) error     { l.drawn.Add(uint64(n)); return nil }
func (l *benchLedger) Undraw(n memapi.Bytes) error   { l.drawn.Add(-uint64(n)); return nil }
func (l *benchLedger) Refund(n memapi.Bytes) error   { l.drawn.Add(-uint64(n)); return nil }

// doubles is the ledger of this package's doubles and of the generated
// fakes: the wrappers under test are built with it, so that they accept the
// grants and accounts above and fakes.NewGrant's.
var doubles = checked.Ledgers(testDoubles{}, fakes.Ledger)

// testDoubles vouches for this package's grant, account and benchLedger
// (recognised by type, as a real ledger recognises what it issued).
type testDoubles struct{}

func (testDoubles) IssuedGrant(g memapi.Grant) (memapi.AuthorityID, bool) {
	switch g.(type) {
	case *grant, *benchLedger:
		return g.Authority(), true
	}
	return "", false
}

func (testDoubles) IssuedAccount(a memapi.Account) (memapi.AuthorityID, bool) {
	switch a.(type) {
	case *account, *benchLedger:
		return a.Authority(), true
	}
	return "", false
}
