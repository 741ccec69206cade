package llamacpp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

// A sleep that moves a weight region to the host tier copies its bytes
// straight from the region into a host buffer, and Wake straight back:
// both are host memory (the CPU mechanism, which is what this package
// runs on), so one memmove each way does it, where pmm.Region.Offload's
// copy goes through pmm.Transfer (each 4 MiB chunk copied out into a
// staging buffer on one stream, then in on another: twice the bytes
// moved). The transaction is Offload's, made of pmm's own steps: the host
// copy is allocated (the host tier charged, with pressure there) before
// the copy, and the region decommitted (the device released) only after
// it; on the way back the region is committed again at its address (the
// device charged, with pressure, bounded by ctx) before the copy, and the
// host copy freed after it. A failure before the decommit, or of the
// commit, leaves the bytes where they were. The KV cache's sparse regions
// move with Offload (their committed ranges are pmm's to find).
//
// When the host binding is not of a CPU mechanism (its memory is not
// addressable here), the weights move with Offload too.

// hostCopier is one region's bytes in the host tier: a *pmm.Offloaded, or
// a *directCopy.
type hostCopier interface {
	Restore(ctx context.Context) error
	Discard() error
	Bytes() memapi.Bytes
}

// directCopy is a weight region's bytes, [0, n), copied into a host buffer.
type directCopy struct {
	m   *Model
	reg *pmm.Region
	n   memapi.Bytes

	mu   sync.Mutex
	host *pmm.Buffer // nil once restored or discarded
	end  string      // why host is nil
}

func (d *directCopy) Bytes() memapi.Bytes { return d.n }

// hostAddressable reports whether b's device is a CPU mechanism's, whose
// addresses are the process's.
func hostAddressable(mgr *pmm.Manager, b *pmm.Binding) bool {
	if b.Device().Kind != memapi.DeviceKindHost {
		return false
	}
	mech, err := mgr.Mechanism(b.Device())
	return err == nil && mech.Info().Mechanism == cpu.SpecName
}

// stagedMoves, when set (tests and benchmarks only), moves the weights
// with pmm.Region.Offload even between host-addressable tiers: the path
// taken for any other host binding, and the staged copy to compare with.
var stagedMoves bool

// moveWeights moves the weight region's committed bytes, [0, w.size), to
// host: straight when both are host-addressable, else with Offload. The
// hostCopier is returned whenever the bytes left the region, even with an
// error (a release of the device backing that failed: it stays charged,
// quarantined, until the commit of the restore removes it).
func (m *Model) moveWeights(ctx context.Context, w *weightBuffer, host *pmm.Binding) (hostCopier, error) {
	const op = "llamacpp.Model.moveWeights"
	if stagedMoves || !hostAddressable(m.opts.Manager, host) || !hostAddressable(m.opts.Manager, m.weights) {
		o, err := w.reg.Offload(ctx, host)
		if o == nil {
			return nil, err
		}
		return o, err
	}
	ha, err := host.Authority()
	if err != nil {
		return nil, err
	}
	if da, err := m.weights.Authority(); err != nil {
		return nil, err
	} else if da == ha {
		return nil, memapi.Errorf(op, memapi.ErrInvalidRange, "the host binding's authority %q is the weights': a move there frees nothing", ha)
	}
	start := time.Now()
	hb, err := host.Allocate(ctx, w.size)
	if err != nil {
		return nil, err
	}
	copy(mem(hb.Addr(), w.size), mem(w.reg.Addr(), w.size))
	copied := time.Now()
	if err := w.reg.Decommit(ctx, memapi.Range{Len: w.size}); err != nil {
		if w.reg.Committed() != 0 {
			// Refused before anything changed: the bytes are still in
			// the region.
			return nil, errors.Join(err, hb.Close())
		}
		return &directCopy{m: m, reg: w.reg, n: w.size, host: hb}, err
	}
	m.moveCopy += copied.Sub(start)
	return &directCopy{m: m, reg: w.reg, n: w.size, host: hb}, nil
}

// Restore commits the region's range again (charged to the weights'
// holder, with pressure, bounded by ctx), copies the bytes back and frees
// the host copy. A commit that fails changes nothing (Restore may be
// called again); after a Restore or Discard that succeeded it is
// memapi.ErrReleased.
func (d *directCopy) Restore(ctx context.Context) error {
	const op = "llamacpp.directCopy.Restore"
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.host == nil {
		return memapi.Errorf(op, memapi.ErrReleased, "the host copy was %s", d.end)
	}
	if err := d.commitAndCopy(ctx); err != nil {
		return err
	}
	hb := d.host
	d.host, d.end = nil, "restored"
	if err := hb.Close(); err != nil {
		return fmt.Errorf("%s: the bytes are restored; releasing the host copy: %w", op, err)
	}
	return nil
}

// Discard frees the host copy; the range stays a hole.
func (d *directCopy) Discard() error {
	const op = "llamacpp.directCopy.Discard"
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.host == nil {
		return memapi.Errorf(op, memapi.ErrReleased, "the host copy was %s", d.end)
	}
	hb := d.host
	d.host, d.end = nil, "discarded"
	return hb.Close()
}

// restoreChunk is how much of a region a restore commits at a time, and
// copySlice how much a copier copies before it yields its P.
const (
	restoreChunk = 16 << 20
	copySlice    = 1 << 20
)

// commitAndCopy commits the region's range again and copies the host
// copy's bytes into it. The kernel's share of a commit (faulting in and
// zeroing the pages) and the copy are about the same work: the range is
// committed in chunks of restoreChunk bytes, one after another, while
// copiers copy the chunks already committed, so the commits and the copies
// run at once, on every core: one copier per P (at most wakeReaders). A
// copy never blocks, so a copier yields its P after each copySlice bytes:
// copiers on every P would otherwise keep the committer, back from each
// commit's system call, waiting for a P until the scheduler preempts one
// (a round of a wake took 4 to 7 times longer so). A
// commit that fails stops it: once the copiers are done, the chunks
// committed are decommitted again (the region as before) and the error
// returned.
func (d *directCopy) commitAndCopy(ctx context.Context) error {
	gran := d.reg.Granularity()
	chunk := max(gran, restoreChunk/gran*gran)
	chunks := make(chan memapi.Range, 1)
	var wg sync.WaitGroup
	var copyTime atomic.Int64
	for range min(runtime.GOMAXPROCS(0), wakeReaders, int((d.n+chunk-1)/chunk)) {
		wg.Go(func() {
			for r := range chunks {
				start := time.Now()
				for off := r.Off; off < r.Off+r.Len; off += copySlice {
					n := min(copySlice, r.Off+r.Len-off)
					copy(mem(d.reg.Addr()+memapi.DeviceAddr(off), n), mem(d.host.Addr()+memapi.DeviceAddr(off), n))
					runtime.Gosched() // the committer, back from a commit, gets a P at once
				}
				copyTime.Add(int64(time.Since(start)))
			}
		})
	}
	var committed []memapi.Range
	var err error
	start := time.Now()
	for off := memapi.Bytes(0); off < d.n && err == nil; off += chunk {
		r := memapi.Range{Off: off, Len: min(chunk, d.n-off)}
		if err = d.reg.Commit(ctx, r); err == nil {
			committed = append(committed, r)
			chunks <- r
		}
	}
	d.m.wakeCommit1 += time.Since(start) // with the waits for a copier: the commits' share of the wake
	close(chunks)
	wg.Wait()
	d.m.wakeCopy1 += time.Duration(copyTime.Load())
	if err != nil {
		uctx := context.WithoutCancel(ctx)
		for _, c := range committed {
			// A decommit that fails leaves a hole all the same (its
			// backing quarantined, removed by the next commit).
			err = errors.Join(err, d.reg.Decommit(uctx, c))
		}
	}
	return err
}
