package governor

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Options configure a Governor. The zero value is ready to use.
type Options struct {
	// Clock measures and schedules deadlines; nil is the system clock.
	Clock Clock
	// OnEvent, if set, receives every Event (see Event for when it is called).
	OnEvent func(Event)
	// Logger receives diagnostics (failed reclaims, expired grants); nil
	// discards them (memgen never logs unasked).
	Logger *slog.Logger
	// DefaultWait bounds the wait of a reservation that has no deadline
	// of its own and whose ctx has none either (context.Background(), a
	// ctx that is only cancellable): once it passed, the reservation
	// fails with an *OverBudgetError whose Err matches
	// context.DeadlineExceeded (its text names the default wait), and the
	// reservation is gone from
	// the queue. 0 means defaultWaitBound; a negative value removes the
	// bound, so such a reservation waits until it is served, its ctx is
	// cancelled or the governor closes. A reservation with a deadline,
	// or a ctx with one, waits until that deadline: DefaultWait never
	// shortens nor lengthens it. It bounds the wait only, never the grant,
	// and is measured on Clock (a simulated clock's time, where one is set).
	// It bounds the authority's Admission for such a reservation too (a
	// shared ledger's lock held by a stopped process, say).
	DefaultWait time.Duration
	// Injector, if set, injects faults into the real ledger, for tests of what sits
	// above it (a manager's rollbacks, a holder's retries): at each operation,
	// before it changes anything, the governor asks it, and an operation it
	// answers with an error fails, changing nothing, as if the ledger had
	// refused: with the error as is when it is an *memapi.Error, and
	// otherwise with an *memapi.Error whose Kind is the error and whose cause
	// is memapi.ErrInjected.
	//
	// It is asked with memapi.Op{Layer: "governor", Name: name, Bytes: n,
	// Authority: a}, where Layer.Name is the operation as its errors name it
	// (memapi.Error.Op, Op.String): "governor.Reserve", "governor.Grant.Draw",
	// "governor.Grant.Undraw", "governor.Grant.Refund", "governor.Grant.Commit",
	// "governor.Grant.Cancel", "governor.Lease.Refund",
	// "governor.Lease.MarkPending", "governor.Lease.Quarantine" and
	// "governor.Lease.RefundQuarantined" (which the account of
	// Lease.QuarantinedAccount calls); n is the operation's bytes (0 for
	// Commit and Cancel) and a its authority. It is called without the
	// governor's locks, from any goroutine, so it must be safe for concurrent
	// use; it may block or record the order of operations.
	//
	// Without one (the default) the governor consults nothing: the check is one
	// nil comparison.
	Injector memapi.Injector
}

// injected asks the Injector (which is set) about the operation op (as its
// errors name it) on authority a of n bytes, and returns the error the
// operation then fails with, or nil.
func (g *Governor) injected(op string, a memapi.AuthorityID, n memapi.Bytes) error {
	if err := g.inject.MaybeError(memapi.Op{Layer: "governor", Name: strings.TrimPrefix(op, "governor."), Bytes: n, Authority: a}); err != nil {
		return memapi.Injected(err, &memapi.Error{Op: op, Authority: a, Wanted: n, Detail: "injected fault"})
	}
	return nil
}

// defaultWaitBound is the wait of a reservation with no deadline when
// Options.DefaultWait is 0.
const defaultWaitBound = 30 * time.Second

// Governor keeps the ledger of every authority and the registry of holders.
// All its methods are safe for concurrent use.
type Governor struct {
	clock   Clock
	onEvent func(Event)
	log     *slog.Logger
	// defaultWait bounds a wait with no deadline (Options.DefaultWait);
	// 0 here means none.
	defaultWait time.Duration
	inject      memapi.Injector // Options.Injector, or nil

	mu      sync.Mutex // serializes registry changes and Close; taken before any authority's mutex
	auths   atomic.Pointer[map[memapi.AuthorityID]*authority]
	holders atomic.Pointer[map[HolderID]*holder]
	closed  atomic.Bool

	ticketSeq atomic.Uint64
}

// New returns a Governor with no authorities and no holders.
func New(opts Options) *Governor {
	g := &Governor{clock: opts.Clock, onEvent: opts.OnEvent, log: opts.Logger, inject: opts.Injector}
	if g.clock == nil {
		g.clock = wallClock()
	}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case opts.DefaultWait == 0:
		g.defaultWait = defaultWaitBound
	case opts.DefaultWait > 0:
		g.defaultWait = opts.DefaultWait
	}
	auths := map[memapi.AuthorityID]*authority{}
	holders := map[HolderID]*holder{}
	g.auths.Store(&auths)
	g.holders.Store(&holders)
	return g
}

// AddAuthority adds an authority with the given capacity in bytes.
func (g *Governor) AddAuthority(id memapi.AuthorityID, capacity memapi.Bytes) error {
	const op = "governor.AddAuthority"
	if capacity > maxBytes {
		return opError(op, memapi.ErrInvalidSize, id, capacity, maxBytes, "capacity too large")
	}
	g.mu.Lock()
	if g.closed.Load() {
		g.mu.Unlock()
		return opError(op, memapi.ErrClosed, id, 0, 0, "")
	}
	old := *g.auths.Load()
	if _, ok := old[id]; ok {
		g.mu.Unlock()
		return opError(op, errDuplicate, id, 0, 0, "authority already exists")
	}
	next := maps.Clone(old)
	next[id] = &authority{g: g, id: id, capacity: capacity, accts: map[HolderID]*account{}, timed: map[*grant]struct{}{}}
	g.auths.Store(&next)
	g.mu.Unlock()
	g.emit(Event{Kind: EventCapacity, Authority: id, Bytes: capacity})
	return nil
}

// SetCapacity changes an authority's capacity. Shrinking below the bytes in
// use (reserved + charged + pending) fails with memapi.ErrInUse and changes
// nothing. Growing serves waiting reservations; waiting reservations larger
// than a shrunk capacity fail with an *OverBudgetError.
func (g *Governor) SetCapacity(id memapi.AuthorityID, capacity memapi.Bytes) error {
	const op = "governor.SetCapacity"
	if capacity > maxBytes {
		return opError(op, memapi.ErrInvalidSize, id, capacity, maxBytes, "capacity too large")
	}
	a := g.authority(id)
	if a == nil {
		return opError(op, errUnknownAuthority, id, 0, 0, "")
	}
	a.mu.Lock()
	if a.shut != nil {
		a.mu.Unlock()
		return opError(op, errUnknownAuthority, id, 0, 0, "")
	}
	if used := a.fig.used(); capacity < used {
		a.mu.Unlock()
		return opError(op, memapi.ErrInUse, id, capacity, used, "capacity below the bytes in use")
	}
	a.capacity = capacity
	for w := a.head; w != nil; {
		next := w.next
		if w.bytes > capacity {
			ahead := a.aheadLocked(w)
			a.removeLocked(w)
			w.err = a.overBudgetLocked(w, ahead, "larger than the capacity", nil)
			close(w.ready)
		}
		w = next
	}
	a.serve()
	a.mu.Unlock()
	g.emit(Event{Kind: EventCapacity, Authority: id, Bytes: capacity})
	return nil
}

// RemoveAuthority removes an authority. It fails with memapi.ErrInUse while
// it has open grants or bytes in use; reservations waiting on it fail with
// memapi.ErrClosed.
func (g *Governor) RemoveAuthority(id memapi.AuthorityID) error {
	const op = "governor.RemoveAuthority"
	g.mu.Lock()
	defer g.mu.Unlock()
	a := (*g.auths.Load())[id]
	if a == nil {
		return opError(op, errUnknownAuthority, id, 0, 0, "")
	}
	a.mu.Lock()
	if used := a.fig.used(); used != 0 || a.fig.grants != 0 {
		a.mu.Unlock()
		return opError(op, memapi.ErrInUse, id, used, 0, "authority has grants or bytes in use")
	}
	a.shutLocked(opError("governor.Reserve", errUnknownAuthority, id, 0, 0, "authority removed"))
	a.mu.Unlock()
	next := maps.Clone(*g.auths.Load())
	delete(next, id)
	g.auths.Store(&next)
	return nil
}

// Close stops the governor: new reservations fail with memapi.ErrClosed,
// waiting ones are woken with it, and deadline timers are stopped (a grant
// past its deadline still refuses Draw and Commit). Open grants and leases
// keep working so holders can unwind. Close is idempotent.
func (g *Governor) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Swap(true) {
		return nil
	}
	for _, a := range g.sortedAuthorities() {
		a.mu.Lock()
		a.shutLocked(opError("governor.Reserve", memapi.ErrClosed, a.id, 0, 0, "governor closed"))
		a.mu.Unlock()
	}
	return nil
}

func (g *Governor) authority(id memapi.AuthorityID) *authority {
	return (*g.auths.Load())[id]
}

func (g *Governor) sortedAuthorities() []*authority {
	as := slices.Collect(maps.Values(*g.auths.Load()))
	slices.SortFunc(as, func(x, y *authority) int { return cmp.Compare(x.id, y.id) })
	return as
}

func (g *Governor) emit(e Event) {
	if g.onEvent == nil {
		return
	}
	e.Time = g.clock.Now()
	g.onEvent(e)
}
