package governor

import (
	"time"

	"github.com/memgen/memgen/generated/memapi"
)

// Snapshot is a copy of the governor's figures. Each authority's figures are
// read under its lock, so its identity holds exactly; different authorities
// are read one after the other. The cached
// bytes of holders that report a cache (CacheReporter) are read after each
// authority's lock is released, and clamped to the charge read under it.
type Snapshot struct {
	Time        time.Time
	Authorities []AuthoritySnapshot // sorted by ID
	Holders     []HolderSnapshot    // sorted by ID
}

// AuthoritySnapshot is one ledger's figures.
type AuthoritySnapshot struct {
	ID memapi.AuthorityID

	Capacity memapi.Bytes
	Reserved memapi.Bytes // open grants + drawn bytes of expired grants
	Charged  memapi.Bytes
	Pending  memapi.Bytes
	Free     memapi.Bytes

	Drawn        memapi.Bytes // the part of Reserved drawn from open grants: backing installed, not committed yet
	ExpiredDrawn memapi.Bytes // the part of Reserved held by expired grants awaiting rollback
	Quarantined  memapi.Bytes // the part of Charged whose free failed: still held, waiting for a retry
	Cached       memapi.Bytes // the part of Charged its holders report as cache: the sum of their HolderAuthoritySnapshot.Cached
	Reclaimable  memapi.Bytes // charged bytes over guarantees, of holders that can reclaim
	Asking       memapi.Bytes // bytes asked by tickets whose Reclaim has not returned

	Waiters      int          // queued reservations
	WaitingBytes memapi.Bytes // their bytes
	Grants       int          // open grants
	Leases       int          // leases holding bytes

	Granted        uint64       // grants made
	Waited         uint64       // reservations that had to queue
	OverBudget     uint64       // reservations that failed over budget or over a limit
	Cancelled      uint64       // waits that ended by context or deadline
	ExpiredGrants  uint64       // grants reclaimed after their deadline
	Tickets        uint64       // tickets whose Reclaim returned
	Freed          memapi.Bytes // bytes holders reported freeing
	PressureEvents uint64       // reservations that did not fit and computed a shortfall (an EventPressure each)
}

// Balanced reports whether reserved + charged + pending + free = capacity.
func (s AuthoritySnapshot) Balanced() bool {
	return s.Reserved+s.Charged+s.Pending+s.Free == s.Capacity && s.Reserved+s.Charged+s.Pending <= s.Capacity
}

// HolderSnapshot is one holder's figures on every authority it used or has
// a guarantee or limit on.
type HolderSnapshot struct {
	ID          HolderID
	Priority    int
	Reclaims    bool                      // it has a Reclaim to ask
	Cache       bool                      // asked before other holders (HolderOptions.Cache)
	Authorities []HolderAuthoritySnapshot // sorted by authority
}

// HolderAuthoritySnapshot is one holder's figures on one authority.
//
// Charged = InUse() + Cached + Quarantined: Cached is what the holder
// reports as cache (CacheReporter; 0 for a holder that does not report
// one), never more than Charged - Quarantined; the rest is data in use.
type HolderAuthoritySnapshot struct {
	Authority   memapi.AuthorityID
	Guarantee   memapi.Bytes
	Limit       memapi.Bytes
	Reserved    memapi.Bytes
	Charged     memapi.Bytes
	Pending     memapi.Bytes
	Quarantined memapi.Bytes // the part of Charged whose free failed
	// Cached is the part of Charged the holder holds only for reuse and
	// can give back without evicting data (a pool's free and pending
	// blocks), as its CachedBytes reported it just after the charge was
	// read, clamped to Charged - Quarantined.
	Cached memapi.Bytes
	// CacheClamped counts the snapshots whose CachedBytes reported more
	// than Charged - Quarantined (a race with a growth or a refund, or a
	// holder that lies); CacheErrors those whose CachedBytes panicked
	// (counted as 0). Both since the account was created.
	CacheClamped  uint64
	CacheErrors   uint64
	Waiting       memapi.Bytes
	Reclaimable   memapi.Bytes
	Grants        int
	Leases        int
	Tickets       uint64       // tickets handed to this holder
	Freed         memapi.Bytes // bytes it reported freeing
	ReclaimErrors uint64
}

// InUse is the part of Charged that holds data: neither cache nor
// quarantined (0 for a hand-made snapshot whose parts exceed Charged).
func (s HolderAuthoritySnapshot) InUse() memapi.Bytes {
	if s.Cached+s.Quarantined > s.Charged {
		return 0
	}
	return s.Charged - s.Cached - s.Quarantined
}

// Snapshot returns the governor's figures now.
func (g *Governor) Snapshot() Snapshot {
	s := Snapshot{Time: g.clock.Now()}
	holders := sortedHolders(*g.holders.Load())
	per := make(map[HolderID][]HolderAuthoritySnapshot, len(holders))
	type pendingRead struct {
		cacheRead
		holder HolderID
		entry  int // in per[holder]
		auth   int // in s.Authorities
	}
	var reads []pendingRead
	for _, a := range g.sortedAuthorities() {
		a.mu.Lock()
		s.Authorities = append(s.Authorities, a.snapshotLocked())
		for _, h := range holders {
			c := a.accts[h.id]
			if c == nil || c.h != h {
				_, g1 := h.guarantee[a.id]
				_, l1 := h.limit[a.id]
				if g1 || l1 {
					per[h.id] = append(per[h.id], HolderAuthoritySnapshot{Authority: a.id, Guarantee: h.guarantee[a.id], Limit: h.limit[a.id]})
				}
				continue
			}
			if r, ok := cacheReadLocked(c); ok {
				reads = append(reads, pendingRead{cacheRead: r, holder: h.id, entry: len(per[h.id]), auth: len(s.Authorities) - 1})
			}
			per[h.id] = append(per[h.id], HolderAuthoritySnapshot{
				Authority:     a.id,
				Guarantee:     c.guarantee,
				Limit:         c.limit,
				Reserved:      c.fig.reserved,
				Charged:       c.fig.charged,
				Pending:       c.fig.pending,
				Quarantined:   c.fig.quarantined,
				Waiting:       c.waiting,
				Reclaimable:   c.reclaimable(),
				Grants:        int(c.fig.grants),
				Leases:        int(c.fig.leases),
				Tickets:       c.tickets,
				Freed:         c.freed,
				ReclaimErrors: c.reclaimErrors,
			})
		}
		a.mu.Unlock()
	}
	// No lock is held now: a holder's CachedBytes may take its own locks,
	// which it may hold while it calls the governor (a pool's growth).
	for _, r := range reads {
		e := &per[r.holder][r.entry]
		e.Cached, e.CacheClamped, e.CacheErrors = r.read(g)
		s.Authorities[r.auth].Cached += e.Cached
	}
	for _, h := range holders {
		s.Holders = append(s.Holders, HolderSnapshot{ID: h.id, Priority: h.priority, Reclaims: h.reclaimer != nil, Cache: h.cache, Authorities: per[h.id]})
	}
	return s
}

// Authority returns one authority's figures, its Cached read as Snapshot
// reads it.
func (g *Governor) Authority(id memapi.AuthorityID) (AuthoritySnapshot, bool) {
	a := g.authority(id)
	if a == nil {
		return AuthoritySnapshot{}, false
	}
	a.mu.Lock()
	s := a.snapshotLocked()
	var reads []cacheRead
	for _, c := range a.accts {
		if r, ok := cacheReadLocked(c); ok {
			reads = append(reads, r)
		}
	}
	a.mu.Unlock()
	for _, r := range reads {
		n, _, _ := r.read(g)
		s.Cached += n
	}
	return s, true
}

func (a *authority) snapshotLocked() AuthoritySnapshot {
	f := &a.fig
	return AuthoritySnapshot{
		ID:             a.id,
		Capacity:       a.capacity,
		Reserved:       f.reserved,
		Charged:        f.charged,
		Pending:        f.pending,
		Free:           a.freeLocked(),
		Drawn:          f.drawn,
		ExpiredDrawn:   f.expiredDrawn,
		Quarantined:    f.quarantined,
		Reclaimable:    a.reclaimableLocked(),
		Asking:         a.asking,
		Waiters:        a.waiters,
		WaitingBytes:   a.waitingBytes,
		Grants:         int(f.grants),
		Leases:         int(f.leases),
		Granted:        a.granted,
		Waited:         a.waited,
		OverBudget:     a.overBudget,
		Cancelled:      a.cancelled,
		ExpiredGrants:  a.expired,
		Tickets:        a.tickets,
		Freed:          a.freed,
		PressureEvents: a.pressureEvents,
	}
}
