package governor

import (
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
)

// CacheReporter is implemented by a Holder whose charge is partly cache:
// memory it holds only for reuse and can give back without evicting data
// (a caching pool's free blocks and segments, and blocks freed behind
// fences that have not completed yet). The governor finds it on the Holder
// passed to Register and reads it for every snapshot (Snapshot, Authority,
// so the Prometheus collector and memreport too); nothing else in the
// ledger depends on it: tickets and their order do not.
//
// CachedBytes reports the holder's cached bytes on authority a now (0 for
// an authority it holds nothing on). It is called without any governor
// lock held, from the goroutine that takes the snapshot, which may be a
// Reclaim's or an event hook's (both may take snapshots), so it must not
// wait on anything those may hold, and must not call the governor's
// snapshots itself. It should be cheap: it runs once per authority the
// holder has an account on, for every snapshot.
//
// The figure is read after the holder's charge, not with it, so the two
// may disagree for an instant (a growth charged after the charge was read,
// a segment refunded before the cache was): the snapshot clamps it to the
// charged bytes that are not quarantined and counts each clamp
// (HolderAuthoritySnapshot.CacheClamped). A CachedBytes that panics counts
// as 0 cached bytes and a CacheErrors; the snapshot goes on.
type CacheReporter interface {
	CachedBytes(a memapi.AuthorityID) memapi.Bytes
}

// cacheRead is one CachedBytes call a snapshot makes once it released the
// authority's lock: the account, and the charged bytes not quarantined
// read under that lock, the most the figure may be.
type cacheRead struct {
	c     *account
	rep   CacheReporter
	limit memapi.Bytes
}

// cacheReadLocked returns the read for holder account c, if its holder
// reports a cache.
func cacheReadLocked(c *account) (cacheRead, bool) {
	if c.h.cacheRep == nil {
		return cacheRead{}, false
	}
	return cacheRead{c: c, rep: c.h.cacheRep, limit: c.fig.charged - c.fig.quarantined}, true
}

// read asks the holder, without any governor lock: a panic counts as an
// error and 0 bytes, a figure above the limit is clamped and counted. It
// returns the figure and the account's counters after the call.
func (r cacheRead) read(g *Governor) (cached memapi.Bytes, clamped, errs uint64) {
	cached, err := r.call()
	if err != nil {
		r.c.cacheErrors.Add(1)
		g.log.Debug("governor: CachedBytes panicked", "authority", r.c.a.id, "holder", r.c.h.id, "err", err)
		cached = 0
	}
	if cached > r.limit {
		r.c.cacheClamped.Add(1)
		cached = r.limit
	}
	return cached, r.c.cacheClamped.Load(), r.c.cacheErrors.Load()
}

func (r cacheRead) call() (n memapi.Bytes, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("CachedBytes panicked: %v", p)
		}
	}()
	return r.rep.CachedBytes(r.c.a.id), nil
}
