package pool

import (
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
)

// The pool's bytes in use and requested, and their peaks, without a cache
// line that every Alloc and Free writes.
//
// Each shard keeps its share of the two totals (tally), changed only under
// its mutex: an Alloc adds to the share of the shard it locked, a Free
// subtracts from the share of the shard it locked, which need not be the
// one the block came from (a share may be negative). The totals are the
// sum of the shares; only a reader holding every shard's lock sees them
// (Stats, Close, an over-budget error).
//
// The peaks stay exact. Every shard also has caps, and the caps add up to
// the peaks: while every share is at or under its cap, the totals are at
// or under the peaks, so an Alloc that keeps its shard's share under the
// cap cannot make a new peak and touches nothing outside its shard. An
// Alloc that would pass its shard's cap syncs: it takes every shard's lock
// (in index order, holding no other shard's), adds its bytes, reads the
// exact totals, raises the peaks to them, and gives the peaks' slack to
// its shard's caps (every other shard's cap drops to its share). A
// workload at a steady level syncs only until the shards' caps cover it;
// one that keeps passing its peak syncs on every new peak, where the
// figure is being made. Frees never sync: lowering a share keeps it under
// its cap.

// lockAll takes every shard's mutex in index order; the caller holds none
// of them (it may hold any level's lock, which comes before them).
func (ss *shards) lockAll() {
	for i := range ss.s {
		ss.s[i].mu.Lock()
	}
}

func (ss *shards) unlockAll() {
	for i := range ss.s {
		ss.s[i].mu.Unlock()
	}
}

// totalsLocked returns the bytes in use and requested; the caller holds
// every shard's lock.
func (ss *shards) totalsLocked() (use, req int64) {
	for i := range ss.s {
		use += ss.s[i].t.use
		req += ss.s[i].t.req
	}
	return use, req
}

// totals returns the bytes in use and requested, under every shard's lock.
func (ss *shards) totals() (use, req int64) {
	ss.lockAll()
	defer ss.unlockAll()
	return ss.totalsLocked()
}

// syncLocked adds size bytes in use (n requested) to sh's share, raises the
// peaks to the new totals and makes the caps add up to them again, the
// slack on sh. The caller holds every shard's lock.
func (ss *shards) syncLocked(sh *shard, size, n uint64) {
	sh.t.use += int64(size)
	sh.t.req += int64(n)
	ss.syncs++
	var use, req int64
	for i := range ss.s {
		o := &ss.s[i].t
		use += o.use
		req += o.req
		o.useCap, o.reqCap = o.use, o.req
	}
	ss.peakUse, ss.peakReq = max(ss.peakUse, use), max(ss.peakReq, req)
	sh.t.useCap += ss.peakUse - use
	sh.t.reqCap += ss.peakReq - req
}

// allocSynced is the fast path when the block would pass the caller's
// shard's caps: the same, under every shard's lock, counted through a
// sync. ok is false when the shard's list emptied meanwhile.
func (ss *shards) allocSynced(closed *atomic.Bool, c int, n uint64, s memapi.Stream) (h Block, ok bool, err error) {
	ss.lockAll()
	defer ss.unlockAll()
	if closed.Load() {
		return Block{}, true, errClosed()
	}
	sh := ss.pick() // locked already, with every other
	b := sh.lists[c].pop()
	if b == nil {
		return Block{}, false, nil
	}
	ss.syncLocked(sh, b.size, n)
	sh.allocs++
	return b.open(n, s), true, nil
}

// count counts size bytes in use (n asked) for a block a level hands out
// under its lock (the caller holds no shard's lock): on the caller's shard
// when that stays under its caps, else through a sync.
func (ss *shards) count(size, n uint64) {
	sh := ss.pick()
	sh.mu.Lock()
	ok := sh.t.tryAdd(size, n) // arithmetic only: nothing here can panic
	sh.mu.Unlock()
	if ok {
		return
	}
	ss.lockAll()
	defer ss.unlockAll()
	ss.syncLocked(sh, size, n)
}

// uncount takes block b out of the figures, on the caller's shard; the
// caller holds no shard's lock.
func (ss *shards) uncount(b *block) {
	sh := ss.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.t.sub(b.size, b.req)
}

// countAlloc and countFree count a small block handed out or freed by a
// level (the depot), on the caller's shard.
func (ss *shards) countAlloc() {
	sh := ss.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.allocs++
}

func (ss *shards) countFree() {
	sh := ss.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.frees++
}
