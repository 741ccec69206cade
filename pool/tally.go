package pool

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

// tally is one shard's share of the pool's figures, guarded by the
// shard's mutex.
type tally struct {
	use, req       int64 // bytes in use (rounded) and requested
	useCap, reqCap int64 // the most use and req may reach without a sync
}

// fits reports whether size bytes in use (n requested) more stay under the
// shard's caps.
func (t *tally) fits(size, n uint64) bool {
	return t.use+int64(size) <= t.useCap && t.req+int64(n) <= t.reqCap
}

func (t *tally) add(size, n uint64) { t.use += int64(size); t.req += int64(n) }
func (t *tally) sub(size, n uint64) { t.use -= int64(size); t.req -= int64(n) }

// lockShards takes every shard's mutex in index order; the caller holds
// none of them (it may hold any level's lock, which comes before them).
func (p *Pool) lockShards() {
	for i := range p.shards {
		p.shards[i].mu.Lock()
	}
}

func (p *Pool) unlockShards() {
	for i := range p.shards {
		p.shards[i].mu.Unlock()
	}
}

// totalsLocked returns the bytes in use and requested; the caller holds
// every shard's lock.
func (p *Pool) totalsLocked() (use, req int64) {
	for i := range p.shards {
		use += p.shards[i].t.use
		req += p.shards[i].t.req
	}
	return use, req
}

// syncLocked adds size bytes in use (n requested) to sh's share, raises the
// peaks to the new totals and makes the caps add up to them again, the
// slack on sh. The caller holds every shard's lock.
func (p *Pool) syncLocked(sh *shard, size, n uint64) {
	sh.t.add(size, n)
	p.syncs++
	use, req := p.totalsLocked()
	p.peakUse, p.peakReq = max(p.peakUse, use), max(p.peakReq, req)
	for i := range p.shards {
		o := &p.shards[i].t
		o.useCap, o.reqCap = o.use, o.req
	}
	sh.t.useCap += p.peakUse - use
	sh.t.reqCap += p.peakReq - req
}

// count counts block b (n bytes asked) in use, for a block the caller took
// under a level's lock, holding no shard's lock: on the caller's shard when it stays
// under its caps, else through a sync.
func (p *Pool) count(b *block, n uint64) {
	if p.countShard(b.size, n) {
		return
	}
	p.lockShards()
	defer p.unlockShards()
	p.syncLocked(p.syncShard(), b.size, n)
}

// countShard adds to the caller's shard if that stays under its caps.
func (p *Pool) countShard(size, n uint64) bool {
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.t.fits(size, n) {
		return false
	}
	sh.t.add(size, n)
	return true
}

// syncShard is the shard a sync gives the slack to: the caller's, named
// without locking it (every shard is locked already).
func (p *Pool) syncShard() *shard {
	sh := p.pick()
	return sh
}

// uncount takes block b out of the figures, on the caller's shard; the
// caller holds no shard's lock.
func (p *Pool) uncount(b *block) {
	sh := p.pick()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.t.sub(b.size, b.req)
}
