package governor

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
)

// HolderID names a registered holder (a model's weights, a KV store, a
// workspace pool).
type HolderID string

// Holder is what owns data in memory and knows what is safe to evict.
//
// Reclaim frees what the holder safely can towards t.Wanted bytes on
// t.Authority and reports how many bytes it freed (0 is a legitimate
// answer). It returns memory by refunding its leases (Lease.Refund) or, when
// the memory must wait for device fences first, by marking them pending
// (Lease.MarkPending) and refunding once the fences complete. It is called
// without any governor lock held, in the goroutine of the reservation that
// needs the memory, with a context that ends when that reservation stops
// waiting (served, failed, or given up by its caller), not when Reclaim
// returns: a holder that answered short may go on giving back what comes
// free while it is alive, and the reservation is served as its refunds
// arrive. Reclaim itself should return by t.Deadline. It may call the governor, but a blocking Reserve on the same
// authority from inside Reclaim waits behind the reservation that asked.
type Holder interface {
	Reclaim(ctx context.Context, t Ticket) (freed memapi.Bytes, err error)
}

// HolderFunc adapts a function to the Holder interface.
type HolderFunc func(ctx context.Context, t Ticket) (memapi.Bytes, error)

// Reclaim calls f.
func (f HolderFunc) Reclaim(ctx context.Context, t Ticket) (memapi.Bytes, error) { return f(ctx, t) }

// HolderOptions configure a registered holder.
type HolderOptions struct {
	// Priority orders holders under pressure: lower is asked first.
	Priority int
	// Cache says the holder's charged bytes are a cache (a caching pool's
	// free segments) that it can drop without losing data. Under pressure
	// caches are asked before every other holder, whatever the priorities;
	// a cache whose own reservation is short is asked first of all (it
	// trims itself before it takes from others).
	Cache bool
	// Guarantee per authority: charged bytes up to it are never asked for
	// (cgroup memory.min).
	Guarantee map[memapi.AuthorityID]memapi.Bytes
	// Limit per authority: a reservation that would take the holder's
	// reserved+charged+pending+waiting bytes past it fails with memapi.ErrOverBudget
	// (cgroup memory.max). Absent or 0: no limit.
	Limit map[memapi.AuthorityID]memapi.Bytes
}

type holder struct {
	id        HolderID
	reclaimer Holder        // nil: the holder is never asked
	cacheRep  CacheReporter // the reclaimer, when it reports a cache
	priority  int
	cache     bool
	guarantee map[memapi.AuthorityID]memapi.Bytes
	limit     map[memapi.AuthorityID]memapi.Bytes
}

// account is one holder's figures on one authority, guarded by the
// authority's mutex.
type account struct {
	a         *authority
	h         *holder
	guarantee memapi.Bytes
	limit     memapi.Bytes

	fig     figures
	books   [2]*figures  // what a transition of any of its records moves besides the record: a.fig and fig
	waiting memapi.Bytes // bytes of queued reservations
	asking  memapi.Bytes // bytes asked of this holder by tickets in flight

	tickets       uint64
	freed         memapi.Bytes
	reclaimErrors uint64

	// Read and counted by snapshots without the lock (cacheRead).
	cacheClamped, cacheErrors atomic.Uint64

	gone bool // removed by Unregister
}

func (c *account) inUse() bool { return c.fig.used() != 0 || c.waiting != 0 || c.fig.grants != 0 }

// reclaimable is what a ticket may ask of the holder now: charged bytes over
// the guarantee, less what tickets in flight already ask.
func (c *account) reclaimable() memapi.Bytes {
	// Quarantined bytes cannot be freed by the holder: never asked for.
	f := &c.fig
	if c.h.reclaimer == nil || f.charged-f.quarantined <= c.guarantee {
		return 0
	}
	r := f.charged - f.quarantined - c.guarantee
	if r <= c.asking {
		return 0
	}
	return r - c.asking
}

// Register adds a holder. h may be nil for a holder that is never asked to
// reclaim. An h that implements CacheReporter has its cached bytes shown
// in every snapshot. Guarantee and limit are checked for consistency (a guarantee above
// the limit is ErrInvalidSize).
func (g *Governor) Register(id HolderID, h Holder, opts HolderOptions) error {
	const op = "governor.Register"
	for auth, floor := range opts.Guarantee {
		if ceil, ok := opts.Limit[auth]; ok && ceil != 0 && floor > ceil {
			return opError(op, memapi.ErrInvalidSize, auth, floor, ceil, "guarantee above limit for holder "+string(id))
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() {
		return opError(op, memapi.ErrClosed, "", 0, 0, "")
	}
	old := *g.holders.Load()
	if _, ok := old[id]; ok {
		return opError(op, errDuplicate, "", 0, 0, "holder "+string(id))
	}
	next := maps.Clone(old)
	rep, _ := h.(CacheReporter)
	next[id] = &holder{
		id:        id,
		reclaimer: h,
		cacheRep:  rep,
		priority:  opts.Priority,
		cache:     opts.Cache,
		guarantee: maps.Clone(opts.Guarantee),
		limit:     maps.Clone(opts.Limit),
	}
	g.holders.Store(&next)
	return nil
}

// Unregister removes a holder. It fails with memapi.ErrInUse while the
// holder has bytes, open grants or waiting reservations on any authority.
func (g *Governor) Unregister(id HolderID) error {
	const op = "governor.Unregister"
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.holders.Load()
	if _, ok := old[id]; !ok {
		return opError(op, errUnknownHolder, "", 0, 0, "holder "+string(id))
	}
	auths := g.sortedAuthorities()
	for _, a := range auths {
		a.mu.Lock()
	}
	defer func() {
		for _, a := range auths {
			a.mu.Unlock()
		}
	}()
	for _, a := range auths {
		if c := a.accts[id]; c != nil && c.inUse() {
			return opError(op, memapi.ErrInUse, a.id, c.fig.used(), 0, "holder "+string(id)+" still holds memory or grants")
		}
	}
	for _, a := range auths {
		if c := a.accts[id]; c != nil {
			c.gone = true
			delete(a.accts, id)
		}
	}
	next := maps.Clone(old)
	delete(next, id)
	g.holders.Store(&next)
	return nil
}

// newAccountLocked makes the holder's account on a, on its first use
// there; nil when no holder id is registered.
func (a *authority) newAccountLocked(id HolderID) *account {
	h := (*a.g.holders.Load())[id]
	if h == nil {
		return nil
	}
	c := &account{a: a, h: h, guarantee: h.guarantee[a.id], limit: h.limit[a.id]}
	c.books = [2]*figures{&a.fig, &c.fig}
	a.accts[id] = c
	return c
}

func sortedHolders(m map[HolderID]*holder) []*holder {
	hs := slices.Collect(maps.Values(m))
	slices.SortFunc(hs, func(x, y *holder) int { return cmp.Compare(x.id, y.id) })
	return hs
}
