package pmm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// Offloading moves a region's committed bytes to another tier and back at
// the same addresses: Region.Offload copies them into a Buffer of a host
// binding (another authority: the host tier's own budget) and decommits
// them, keeping the reservation; Offloaded.Restore commits the same ranges
// again, copies the bytes back and frees the host copy. A holder that
// keeps pointers into the region (an engine's tensors) keeps them: while
// offloaded the ranges are holes, and after the restore they hold the same
// bytes at the same addresses.
//
// Each move is one transaction of the region, ordered so that the data is
// always whole in one place and the ledger always exact: the destination
// is charged before the copy, and the source is released only after the
// copy completed. A failure at any step leaves the bytes where they were.

// offloadState is where an Offloaded is in its life.
type offloadState uint8

const (
	offloadHeld      offloadState = iota // the host copy holds the bytes; the ranges are holes
	offloadRestored                      // the bytes are back in the region; the host copy is released
	offloadDiscarded                     // the host copy is released; the ranges stay holes
)

// Offloaded is the host copy of a region's ranges that Region.Offload moved
// out: it holds their bytes, charged to the host binding's holder on its
// authority, until Restore puts them back or Discard drops them. Its
// methods are safe for concurrent use; the first Restore or Discard that
// succeeds ends it. Once its region is closed, Restore fails with
// memapi.ErrClosed and Discard releases the host copy.
type Offloaded struct {
	r     *Region
	hostD *device
	host  *Buffer        // nil when no bytes were offloaded
	rngs  []memapi.Range // in address order, not adjacent to each other
	mu    sync.Mutex     // serializes Restore and Discard
	state offloadState   // guarded by mu
}

// Ranges returns the offloaded ranges of the region, in address order.
func (o *Offloaded) Ranges() []memapi.Range { return slices.Clone(o.rngs) }

// Bytes returns the bytes offloaded: the host copy's size.
func (o *Offloaded) Bytes() memapi.Bytes { return sumRanges(o.rngs) }

// Offload moves ranges of the region to host memory, at the same
// addresses afterwards (see Offloaded.Restore). With no range given, every
// piece of private committed backing (Grow, Commit) goes; otherwise each
// range must be granule-aligned, below Len, wholly private committed
// backing (memapi.ErrNotCommitted) and apart from the others. Views of
// shared backings stay where they are.
//
// As one transaction of the region: the device work recorded on it
// (RecordUse) is waited for, bounded by ctx; a Buffer of the offloaded
// bytes is allocated through host, charged to its holder on its authority
// (with pressure there, bounded by ctx); the bytes are copied into it; the
// ranges are decommitted (holes, released like Decommit's: pending until
// the mechanism freed them, then refunded to the region's holder). A
// failure before the decommit changes nothing in the region and releases
// the host copy. host must be a binding of the same manager on another
// authority (memapi.ErrInvalidRange otherwise: offloading into the budget
// that is short would free nothing).
func (r *Region) Offload(ctx context.Context, host *Binding, rngs ...memapi.Range) (*Offloaded, error) {
	const op = "pmm.Region.Offload"
	s := r.s
	if host == nil {
		return nil, memapi.Errorf(op, memapi.ErrNilHandle, "no host binding")
	}
	if host.m != s.bind.m {
		return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "the host binding is of another manager")
	}
	hd, err := host.m.device(op, host.key)
	if err != nil {
		return nil, err
	}
	if hd.authority == s.d.authority {
		return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "the host binding's authority %q is the region's: an offload there frees nothing", hd.authority)
	}
	if err := s.begin(ctx, op); err != nil {
		return nil, err
	}
	var done memapi.Fence
	defer func() { s.end(done) }()
	length := s.len()
	s.mu.Lock()
	rngs, err = s.offloadRanges(op, rngs, length)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	o := &Offloaded{r: r, hostD: hd, rngs: rngs}
	if len(rngs) == 0 {
		return o, nil
	}
	for _, f := range s.lc.Pending() {
		if err := f.Wait(ctx); err != nil {
			return nil, &memapi.Error{Op: op, Kind: memapi.ErrInUse, Detail: "device work recorded on the region has not finished", Err: err}
		}
	}
	total := sumRanges(rngs)
	hb, err := host.Allocate(ctx, total)
	if err != nil {
		return nil, err
	}
	var at memapi.Bytes
	for _, rng := range rngs {
		if err := Transfer(ctx, 0, hd.ctx.Device(), hb.Addr()+memapi.DeviceAddr(at), s.d.ctx.Device(), s.res.Addr()+memapi.DeviceAddr(rng.Off), rng.Len); err != nil {
			return nil, errors.Join(fmt.Errorf("%s: copying [%#x, +%#x) out: %w", op, rng.Off, rng.Len, err), hb.Close())
		}
		at += rng.Len
	}
	o.host = hb
	s.mu.Lock()
	keep, drop := s.segs, []segment(nil)
	for _, rng := range rngs {
		k, d, err := cutOut(keep, rng)
		if err != nil { // checked above, under the same transaction
			s.mu.Unlock()
			return nil, errors.Join(&memapi.Error{Op: op, Kind: memapi.ErrNotCommitted, Wanted: rng.Len, Detail: err.Error()}, hb.Close())
		}
		keep, drop = k, append(drop, d...)
	}
	s.segs = keep
	for _, sg := range drop {
		_ = sg.lease.MarkPending(sg.r.Len)
	}
	s.mu.Unlock()
	done, err = s.queueRelease(op, fmt.Sprintf("offload of %d bytes of region %#x", total, s.res.Addr()), total, drop)
	if err != nil {
		// The bytes are in the host copy and the ranges are holes; the
		// device backing stays charged, quarantined, until a retry.
		return o, err
	}
	return o, nil
}

// offloadRanges resolves Offload's ranges under s.mu: every private
// committed piece (adjacent ones joined) when none is given, or the given
// ones checked against the region's length and sorted.
func (s *regionState) offloadRanges(op string, rngs []memapi.Range, length memapi.Bytes) ([]memapi.Range, error) {
	if len(rngs) == 0 {
		var out []memapi.Range
		for _, sg := range s.segs {
			if !sg.joins() || sg.grant != (governor.Grant{}) {
				continue
			}
			if n := len(out); n > 0 && out[n-1].Off+out[n-1].Len == sg.r.Off {
				out[n-1].Len += sg.r.Len
				continue
			}
			out = append(out, sg.r)
		}
		return out, nil
	}
	rngs = slices.Clone(rngs)
	slices.SortFunc(rngs, func(x, y memapi.Range) int { return cmpOff(x.Off, y.Off) })
	for i, rng := range rngs {
		if err := s.checkHoleRange(op, rng, length, "length"); err != nil {
			return nil, err
		}
		if i > 0 && rngs[i-1].Off+rngs[i-1].Len >= rng.Off {
			return nil, &memapi.Error{Op: op, Kind: memapi.ErrInvalidRange, Wanted: rng.Len,
				Detail: fmt.Sprintf("ranges [%#x, +%#x) and [%#x, +%#x) overlap or touch: give them as one", rngs[i-1].Off, rngs[i-1].Len, rng.Off, rng.Len)}
		}
		if _, _, err := cutOut(s.segs, rng); err != nil {
			return nil, &memapi.Error{Op: op, Kind: memapi.ErrNotCommitted, Wanted: rng.Len, Detail: err.Error()}
		}
	}
	return rngs, nil
}

// Restore puts the offloaded bytes back at their addresses and releases the
// host copy. As one transaction of the region: every range must still be a
// hole (memapi.ErrCommitted otherwise, nothing changed); each is committed
// again, charged to the region's holder (with pressure, bounded by ctx);
// the bytes are copied back; the grants become the ranges' leases; then
// the host copy is released. On a failure before the last step the new
// backing is removed and its grants returned, and the bytes stay in the
// host copy, so Restore may be called again; should that removal fail, the
// range is quarantined (charged, visible) and the error is of kind
// ep.ErrQuarantined. After a successful Restore or a Discard it fails with
// memapi.ErrReleased.
func (o *Offloaded) Restore(ctx context.Context) error {
	const op = "pmm.Offloaded.Restore"
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.ended(op); err != nil {
		return err
	}
	if len(o.rngs) == 0 {
		o.state = offloadRestored
		return nil
	}
	s := o.r.s
	if err := s.begin(ctx, op); err != nil {
		return err
	}
	defer s.end()
	s.mu.Lock()
	for _, rng := range o.rngs {
		if _, busy := holeAt(s.segs, rng); busy {
			s.mu.Unlock()
			return &memapi.Error{Op: op, Kind: memapi.ErrCommitted, Wanted: rng.Len,
				Detail: fmt.Sprintf("[%#x, +%#x) was backed while offloaded", rng.Off, rng.Len)}
		}
	}
	s.mu.Unlock()
	// undo removes the new backing of the ranges backed so far, last
	// first: a range whose grant was committed refunds its lease through
	// the decommit, one still open its grant, which is then cancelled. It
	// runs to the end whatever ctx does.
	var grants []governor.Grant
	var leases []governor.Lease
	undo := func(err error) error {
		uctx := context.WithoutCancel(ctx)
		for j := len(grants) - 1; j >= 0; j-- {
			rng := o.rngs[j]
			if j < len(leases) {
				if derr := s.vb.Decommit(uctx, s.res, rng, leases[j]); derr != nil {
					s.quarantine([]segment{{r: rng, lease: leases[j]}})
					err = &memapi.Error{Op: op, Kind: ep.ErrQuarantined, Authority: s.d.authority, Wanted: rng.Len,
						Detail: "rollback could not remove the new backing; it stays charged until a retry removes it", Err: errors.Join(err, derr)}
				}
				continue
			}
			if derr := s.vb.Decommit(uctx, s.res, rng, grants[j]); derr != nil {
				err = s.quarantineCommit(op, rng, grants[j], errors.Join(err, derr))
				continue
			}
			err = cancel(s.d, s.grantName(rng), grants[j], err)
		}
		return err
	}
	for _, rng := range o.rngs {
		g, err := s.back(ctx, op, rng)
		if err != nil {
			return undo(err)
		}
		grants = append(grants, g)
	}
	var at memapi.Bytes
	for _, rng := range o.rngs {
		if err := Transfer(ctx, 0, s.d.ctx.Device(), s.res.Addr()+memapi.DeviceAddr(rng.Off), o.hostD.ctx.Device(), o.host.Addr()+memapi.DeviceAddr(at), rng.Len); err != nil {
			return undo(fmt.Errorf("%s: copying [%#x, +%#x) back: %w", op, rng.Off, rng.Len, err))
		}
		at += rng.Len
	}
	for _, g := range grants {
		lease, err := g.Commit()
		if err != nil {
			return undo(err)
		}
		leases = append(leases, lease)
	}
	s.mu.Lock()
	for i, rng := range o.rngs {
		at, _ := holeAt(s.segs, rng)
		s.segs = slices.Insert(s.segs, at, segment{r: rng, lease: leases[i]})
		s.top = max(s.top, rng.Off+rng.Len)
	}
	s.mu.Unlock()
	o.state = offloadRestored
	if err := o.host.Close(); err != nil {
		return fmt.Errorf("%s: the bytes are restored; releasing the host copy: %w", op, err)
	}
	return nil
}

// Discard releases the host copy without restoring it: the ranges stay
// holes, which a later Commit or Grow backs with zeroed memory. After a
// successful Restore or Discard it fails with memapi.ErrReleased.
func (o *Offloaded) Discard() error {
	const op = "pmm.Offloaded.Discard"
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.ended(op); err != nil {
		return err
	}
	o.state = offloadDiscarded
	if o.host == nil {
		return nil
	}
	return o.host.Close()
}

// ended refuses a method of an Offloaded that was restored or discarded.
func (o *Offloaded) ended(op string) error {
	switch o.state {
	case offloadRestored:
		return memapi.Errorf(op, memapi.ErrReleased, "the offloaded bytes were restored")
	case offloadDiscarded:
		return memapi.Errorf(op, memapi.ErrReleased, "the offloaded bytes were discarded")
	}
	return nil
}

func sumRanges(rngs []memapi.Range) memapi.Bytes {
	var n memapi.Bytes
	for _, r := range rngs {
		n += r.Len
	}
	return n
}
