package pmm

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// A region's holes: ranges below Len with no backing, whose private
// backing was decommitted (Decommit) or that a sparse Commit above Len
// stepped over, and that Commit backs (again). The region keeps one ledger of its
// pieces, the segments in address order; a hole is the absence of a
// segment, so the governor's charge for the region is the sum of its
// segments' leases (plus what is quarantined), which is what the mechanism
// has committed.

// Committed returns the bytes of private backing the region holds below
// Len (commits and copy-on-write copies), holes excluded, quarantined
// backing excluded (Quarantined).
func (r *Region) Committed() memapi.Bytes {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	var n memapi.Bytes
	for _, sg := range r.s.segs {
		if sg.committed() || (sg.view != nil && sg.shared == nil) {
			n += sg.r.Len
		}
	}
	return n
}

// checkHoleRange validates a range given to Decommit or Commit: non-empty,
// aligned to the granularity, and below limit (the region's length for
// Decommit, its reservation for Commit).
func (s *regionState) checkHoleRange(op string, rng memapi.Range, limit memapi.Bytes, what string) error {
	if rng.Len == 0 || rng.Off%s.gran != 0 || rng.Len%s.gran != 0 || rng.Off+rng.Len < rng.Off || rng.Off+rng.Len > limit {
		return &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: rng.Len, Available: limit,
			Detail: fmt.Sprintf("range [%#x, +%#x) is empty, not aligned to %#x or beyond the region's %s", rng.Off, rng.Len, s.gran, what)}
	}
	return nil
}

// Decommit removes the private backing of rng, a range inside the region
// (aligned to the granularity, below Len) that must be wholly committed
// by Grow or Commit (not a view): the region's length and address stay, and
// rng becomes a hole. Like Shrink, the backing is released behind the
// region's recorded fences, its bytes pending-free until then and refunded
// after the mechanism's decommit; the range can be committed again only
// after that release ran (later transactions wait for it, bounded by their
// ctx). A range not wholly committed is memapi.ErrNotCommitted, one out of
// bounds memapi.ErrInvalidRange, and both change nothing. A release that
// fails quarantines the backing (charged, visible in Quarantined); a later
// Commit or Grow that backs its range removes it first, as do Retry and
// Close, while other ranges are committed regardless.
func (r *Region) Decommit(ctx context.Context, rng memapi.Range) error {
	const op = "pmm.Region.Decommit"
	s := r.s
	if err := s.begin(ctx, op); err != nil {
		return err
	}
	var done memapi.Fence
	defer func() { s.end(done) }()
	if err := s.checkHoleRange(op, rng, s.len(), "length"); err != nil {
		return err
	}
	s.mu.Lock()
	keep, drop, err := cutOut(s.segs, rng)
	if err != nil {
		s.mu.Unlock()
		return &memapi.Error{Op: op, Kind: memapi.ErrNotCommitted, Wanted: rng.Len, Detail: err.Error()}
	}
	s.segs = keep
	for _, sg := range drop {
		_ = sg.lease.MarkPending(sg.r.Len)
	}
	s.mu.Unlock()
	done, err = s.queueRelease(op, fmt.Sprintf("decommit of [%#x, +%#x) in region %#x", rng.Off, rng.Len, s.res.Addr()), rng.Len, drop)
	return err
}

// cutOut splits the segments that rng covers at its ends and returns the
// segments kept and the pieces inside rng (each with its segment's lease),
// or an error when rng is not wholly private committed backing with a
// lease. segs is not modified.
func cutOut(segs []segment, rng memapi.Range) (keep, drop []segment, err error) {
	end := rng.Off + rng.Len
	var covered memapi.Bytes
	keep = make([]segment, 0, len(segs)+1)
	for _, sg := range segs {
		sEnd := sg.r.Off + sg.r.Len
		if sEnd <= rng.Off || sg.r.Off >= end {
			keep = append(keep, sg)
			continue
		}
		if !sg.committed() || sg.lease == (governor.Lease{}) || sg.grant != (governor.Grant{}) {
			return nil, nil, fmt.Errorf("[%#x, +%#x) is not private committed backing", sg.r.Off, sg.r.Len)
		}
		lo, hi := max(sg.r.Off, rng.Off), min(sEnd, end)
		if sg.r.Off < lo {
			keep = append(keep, segment{r: memapi.Range{Off: sg.r.Off, Len: lo - sg.r.Off}, lease: sg.lease})
		}
		drop = append(drop, segment{r: memapi.Range{Off: lo, Len: hi - lo}, lease: sg.lease})
		covered += hi - lo
		if hi < sEnd {
			keep = append(keep, segment{r: memapi.Range{Off: hi, Len: sEnd - hi}, lease: sg.lease})
		}
	}
	if covered != rng.Len {
		return nil, nil, fmt.Errorf("%d of the range's %d bytes are committed", covered, rng.Len)
	}
	return keep, drop, nil
}

// Commit backs rng, any granule-aligned range inside the reservation that
// has no backing: a hole below Len, or a range above it (sparse: Len then
// rises to rng's end, and what lies between the old Len and rng is a
// hole). As one transaction, like Grow: quarantined backing
// that overlaps rng is removed first (quarantined pieces elsewhere stay as
// they are and do not stop it), then a grant for rng's bytes is reserved (with pressure,
// bounded by ctx) → the mechanism commits rng, drawing from it → the grant
// is committed into the lease of the new piece. On any failure the range
// is decommitted, the grant returned and the region is as before; should
// that decommit fail, the range is quarantined (charged, visible) and the
// error is of kind ep.ErrQuarantined. A range with backing is
// memapi.ErrCommitted, one beyond the reservation memapi.ErrInvalidRange;
// both change nothing. Each committed range is charged exactly its bytes.
func (r *Region) Commit(ctx context.Context, rng memapi.Range) error {
	const op = "pmm.Region.Commit"
	s := r.s
	if err := s.begin(ctx, op); err != nil {
		return err
	}
	defer s.end()
	if err := s.checkHoleRange(op, rng, s.res.Size(), "reservation"); err != nil {
		return err
	}
	s.mu.Lock()
	i, busy := holeAt(s.segs, rng)
	s.mu.Unlock()
	if busy {
		return &memapi.Error{Op: op, Kind: memapi.ErrCommitted, Wanted: rng.Len,
			Detail: fmt.Sprintf("[%#x, +%#x) is not a hole", rng.Off, rng.Len)}
	}
	// Quarantined pieces never overlap the region's segments, so i
	// stays where the new piece goes.
	g, err := s.back(ctx, op, rng)
	if err != nil {
		return err
	}
	lease, err := g.Commit()
	if err != nil {
		if derr := s.vb.Decommit(ctx, s.res, rng, g); derr != nil {
			return s.quarantineCommit(op, rng, g, errors.Join(err, derr))
		}
		return cancel(s.d, s.grantName(rng), g, err)
	}
	s.mu.Lock()
	s.segs = slices.Insert(s.segs, i, segment{r: rng, lease: lease})
	s.top = max(s.top, rng.Off+rng.Len)
	s.mu.Unlock()
	return nil
}

// holeAt returns where a segment for rng goes in segs, and whether any
// segment overlaps rng.
func holeAt(segs []segment, rng memapi.Range) (int, bool) {
	end := rng.Off + rng.Len
	i := 0
	for ; i < len(segs); i++ {
		sg := segs[i]
		if sg.r.Off+sg.r.Len <= rng.Off {
			continue
		}
		return i, sg.r.Off < end
	}
	return i, false
}
