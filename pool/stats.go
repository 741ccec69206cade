package pool

import "github.com/memgen/memgen/generated/memapi"

// Stats are a pool's figures, taken at one instant (every lock held). They
// cover ONNX Runtime's allocator statistics (GetStats: InUse, TotalAllocated,
// MaxInUse, NumAllocs, NumArenaExtensions, NumArenaShrinkages) and PyTorch's
// memory_stats (allocated, requested, reserved, active/inactive split,
// segment, alloc and free counts, num_ooms).
type Stats struct {
	Backing Backing

	InUse     memapi.Bytes // bytes of blocks in use, rounded (allocated_bytes)
	Requested memapi.Bytes // bytes asked for by blocks in use (requested_bytes)
	Cached    memapi.Bytes // bytes held and not in use: free chunks, free slab blocks, pending blocks (decommitted granules excluded)
	Pending   memapi.Bytes // of Cached: blocks freed behind fences not yet complete
	// Segments is the bytes held from the binding (reserved_bytes,
	// TotalAllocated): what the governor charges the pool's holder, the
	// mechanism's committed bytes. With BackingRegion that is the
	// region's length less its decommitted granules (Decommitted).
	Segments memapi.Bytes
	// Decommitted is the bytes of whole free granules inside the region
	// (BackingRegion) whose backing was given back: addresses only, not
	// held, not in Segments or Cached (holes.go).
	Decommitted memapi.Bytes
	// Quarantined is backing the pool gave back whose release failed:
	// not in Segments, still charged to the pool's holder (as quarantined)
	// and held by the mechanism, retried by the next Trim, Reclaim or
	// Close (release.go).
	Quarantined memapi.Bytes

	PeakInUse     memapi.Bytes // MaxInUse
	PeakRequested memapi.Bytes
	PeakSegments  memapi.Bytes
	// PeakSyncs is how many allocations took every shard's lock to keep
	// the peaks exact (tally.go): a workload at a steady level stops
	// adding to it.
	PeakSyncs uint64

	NumSegments   int
	Allocs, Frees uint64 // NumAllocs; frees
	SegmentAllocs uint64 // NumArenaExtensions (segment allocations)
	SegmentFrees  uint64 // NumArenaShrinkages (segments given back)
	Slabs         uint64 // slabs carved
	Splits        uint64 // chunks split by best fit
	Merges        uint64 // chunks coalesced
	Reclaims      uint64 // Reclaim or Trim calls that gave bytes back
	Reclaimed     memapi.Bytes
	OverBudget    uint64 // allocations failed over budget (num_ooms)
	StreamReuse   uint64 // pending blocks reused at once on their own stream
	Decommits     uint64 // passes that decommitted free granules inside the region
	Recommits     uint64 // chunks whose decommitted granules were committed again
}

// Fragmentation is held bytes over requested bytes in use (1 is perfect; 0
// when nothing is requested).
func (s Stats) Fragmentation() float64 {
	if s.Requested == 0 {
		return 0
	}
	return float64(s.Segments) / float64(s.Requested)
}

// PeakFragmentation is peak held over peak requested.
func (s Stats) PeakFragmentation() float64 {
	if s.PeakRequested == 0 {
		return 0
	}
	return float64(s.PeakSegments) / float64(s.PeakRequested)
}

// Stats returns the pool's figures, holding every level's lock and every
// shard's. Cached is counted from the free lists, the arena and the pending
// list, not derived from InUse, so that Cached + InUse == Segments is a
// check, not a definition.
func (p *Pool) Stats() Stats {
	p.lockLevels()
	defer p.unlockLevels()
	ss, d, a, h, g := &p.shards, &p.depot, &p.arena, &p.holes, &p.segs
	use, req := ss.totalsLocked()
	s := Stats{
		Backing:       p.opts.Backing,
		InUse:         memapi.Bytes(use),
		Requested:     memapi.Bytes(req),
		Segments:      memapi.Bytes(g.held),
		PeakInUse:     memapi.Bytes(ss.peakUse),
		PeakRequested: memapi.Bytes(ss.peakReq),
		PeakSegments:  memapi.Bytes(g.peak),
		PeakSyncs:     ss.syncs,
		NumSegments:   g.count(),
		Allocs:        a.allocs + g.hugeAllocs,
		Frees:         a.frees + g.hugeFrees + d.frees,
		SegmentAllocs: g.allocs,
		SegmentFrees:  g.frees,
		Slabs:         d.slabs,
		Splits:        a.splits,
		Merges:        a.merges,
		Reclaims:      g.reclaims,
		Reclaimed:     memapi.Bytes(g.reclaimed.Load()),
		OverBudget:    g.overBudget,
		StreamReuse:   d.reuse,
		Decommitted:   memapi.Bytes(h.bytes()),
		Decommits:     h.decommits,
		Recommits:     h.recommits,
	}
	depot, pending := d.cachedBytes()
	cached := a.freeBytes() + depot
	for _, c := range g.huge {
		cached += c.size
	}
	for i := range ss.s {
		sh := &ss.s[i]
		s.Allocs += sh.allocs
		s.Frees += sh.frees
		for c := range sh.lists {
			cached += uint64(sh.lists[c].n) * classSize[c]
		}
	}
	s.Pending = memapi.Bytes(pending)
	// Decommitted granules lie only in free chunks and in busy ones
	// (out of the arena while a pmm call commits or decommits theirs).
	cached += a.busy - h.bytes()
	s.Cached = memapi.Bytes(cached)
	s.Quarantined = memapi.Bytes(g.quarantined())
	return s
}
