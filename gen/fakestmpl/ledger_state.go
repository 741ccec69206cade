//go:build memgentmpl

package fakes

import (
	"sync"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// grantState is the model behind Grant: a budget of limit bytes, drawn and
// undrawn by the checked wrapper, that refuses draws once closed.
type grantState struct {
	authority memapi.AuthorityID
	mu        sync.Mutex
	limit     memapi.Bytes
	drawn     memapi.Bytes
	closed    bool
}

// Authority returns the grant's authority.
func (s *grantState) Authority() memapi.AuthorityID { return s.authority }

// Draw takes n bytes, failing with ErrGrantClosed after Close and with
// ErrGrantExhausted when fewer than n remain.
func (s *grantState) Draw(n memapi.Bytes) error {
	const op = "Grant.Draw"
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return &memapi.Error{Op: op, Kind: memapi.ErrGrantClosed, Authority: s.authority, Wanted: n}
	}
	if n > s.limit-s.drawn {
		return &memapi.Error{
			Op:        op,
			Kind:      memapi.ErrGrantExhausted,
			Authority: s.authority,
			Wanted:    n,
			Available: s.limit - s.drawn,
		}
	}
	s.drawn += n
	return nil
}

// Undraw gives back n drawn bytes; giving back more than was drawn is a
// ledger bug reported as ErrInvalidSize.
func (s *grantState) Undraw(n memapi.Bytes) error { return s.undraw("Grant.Undraw", n) }

// Refund is Undraw: a grant is also the account its own rollbacks refund to.
func (s *grantState) Refund(n memapi.Bytes) error { return s.undraw("Account.Refund", n) }

func (s *grantState) undraw(op string, n memapi.Bytes) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > s.drawn {
		return &memapi.Error{
			Op:        op,
			Kind:      memapi.ErrInvalidSize,
			Authority: s.authority,
			Wanted:    n,
			Available: s.drawn,
			Detail:    "more than was drawn",
		}
	}
	s.drawn -= n
	return nil
}

// NewGrant returns a fake grant of authority with a budget of limit bytes.
func NewGrant(authority memapi.AuthorityID, limit memapi.Bytes) *Grant {
	g := &Grant{source: "grant:" + string(authority), faults: &faults{}}
	g.state.authority, g.state.limit = authority, limit
	g.faults.init(g.source, grantFaultMethods)
	return g
}

// Drawn reports the bytes drawn and not given back.
func (g *Grant) Drawn() memapi.Bytes {
	g.state.mu.Lock()
	defer g.state.mu.Unlock()
	return g.state.drawn
}

// Remaining reports the bytes that can still be drawn.
func (g *Grant) Remaining() memapi.Bytes {
	g.state.mu.Lock()
	defer g.state.mu.Unlock()
	return g.state.limit - g.state.drawn
}

// Close ends the grant as a commit or cancel would: later draws fail with
// ErrGrantClosed; undraws and refunds still work. It is idempotent.
func (g *Grant) Close() error {
	g.state.mu.Lock()
	defer g.state.mu.Unlock()
	g.state.closed = true
	return nil
}

// SetRecorder makes the grant record its calls into r (nil stops recording).
// Call it before the grant is shared.
func (g *Grant) SetRecorder(r *Recorder) { g.rec = r }

// accountState is the model behind Account: it sums what is refunded.
type accountState struct {
	authority memapi.AuthorityID
	mu        sync.Mutex
	refunded  memapi.Bytes
}

// Authority returns the account's authority.
func (s *accountState) Authority() memapi.AuthorityID { return s.authority }

// Refund adds n to the refunded total.
func (s *accountState) Refund(n memapi.Bytes) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refunded += n
	return nil
}

// NewAccount returns a fake account of authority.
func NewAccount(authority memapi.AuthorityID) *Account {
	a := &Account{source: "account:" + string(authority), faults: &faults{}}
	a.state.authority = authority
	a.faults.init(a.source, accountFaultMethods)
	return a
}

// Refunded reports the bytes refunded so far.
func (a *Account) Refunded() memapi.Bytes {
	a.state.mu.Lock()
	defer a.state.mu.Unlock()
	return a.state.refunded
}

// SetRecorder makes the account record its calls into r (nil stops
// recording). Call it before the account is shared.
func (a *Account) SetRecorder(r *Recorder) { a.rec = r }
