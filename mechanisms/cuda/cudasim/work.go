package cudasim

import "github.com/memgen/memgen/mechanisms/cuda/driver"

// work is one operation the device runs after the call that enqueued it
// returned: a device-to-device copy, a memset, the DMA half of a host-to-device
// copy, or an injected fault (a kernel the simulator does not run). The
// driver documents these as not synchronous with the host
// (https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html):
// "For transfers from device memory to device memory, no host-side
// synchronization is performed"; for pageable host-to-device transfers "the
// DMA to final destination may not have completed"; "The synchronous memset
// functions are asynchronous with respect to the host except when the target
// is pinned host memory or a Unified Memory region".
//
// Work runs in the order it was enqueued, when something waits for it
// (cuStreamSynchronize, cuEventSynchronize, cuEventQuery of a later event,
// the synchronous calls, Sim.Drain, CompleteEvents). It resolves its
// addresses when it runs, as the GPU does: memory unmapped before then, or a
// mapping without the access it needs, faults (CUDA_ERROR_ILLEGAL_ADDRESS,
// sticky), and the fault is reported by the call that waited.
type work struct {
	seq    uint64
	dev    *device
	stream driver.Stream
	spans  []span               // device ranges it touches
	run    func() driver.Result // applies the effect when it runs
	lost   bool                 // a range it touches was unmapped before it ran
}

// span is a device range [addr, addr+n).
type span struct{ addr, n uint64 }

func (a span) overlaps(addr, n uint64) bool { return a.addr < addr+n && addr < a.addr+a.n }

// enqueue adds work on stream st of device d and returns its sequence number.
func (s *Sim) enqueue(d *device, st driver.Stream, run func() driver.Result, spans ...span) uint64 {
	s.seq++
	s.pending = append(s.pending, &work{seq: s.seq, dev: d, stream: st, spans: spans, run: run})
	return s.seq
}

// runUntil runs the pending work enqueued up to seq, in order, and returns
// the first fault (which is also made sticky). Every stream the simulator
// hands out is ordered with the legacy default stream where the work is
// enqueued, so running a prefix of the one queue is what any wait on it means
// (running more than the waited-for work is never stricter than a GPU).
func (s *Sim) runUntil(seq uint64) driver.Result {
	first := driver.Success
	n := 0
	for _, w := range s.pending {
		if w.seq > seq {
			break
		}
		n++
		r := w.run()
		if w.lost {
			r = driver.ErrIllegalAddress
		}
		if r != driver.Success {
			if s.sticky == driver.Success {
				s.sticky = r
			}
			if first == driver.Success {
				first = r
			}
		}
	}
	if n > 0 {
		s.pending = append(s.pending[:0], s.pending[n:]...)
		s.cond.Broadcast()
	}
	if first == driver.Success {
		first = s.sticky
	}
	return first
}

// runAll runs every pending work item.
func (s *Sim) runAll() driver.Result { return s.runUntil(s.seq) }

// unmapping marks the pending work touching [addr, addr+n) as lost: when it
// runs it faults. cuMemUnmap is not documented to wait for work on the range
// (PyTorch's expandable segments synchronize before it because it "does not
// appear to synchronize in all cases"), so the simulator does not wait: work
// still pending over an unmapped range is how a missing synchronize shows.
func (s *Sim) unmapping(addr, n uint64) {
	for _, w := range s.pending {
		for _, sp := range w.spans {
			if sp.overlaps(addr, n) {
				w.lost = true
			}
		}
	}
}

// dropWork forgets the pending work of d (its context was destroyed).
func (s *Sim) dropWork(d *device) {
	keep := s.pending[:0]
	for _, w := range s.pending {
		if w.dev != d {
			keep = append(keep, w)
		}
	}
	s.pending = keep
}

// Drain runs every pending work item now, as the GPU finishing its work
// would, and returns the first fault (CUDA_SUCCESS when none).
func (s *Sim) Drain() driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runAll()
}

// Fault enqueues, on the legacy default stream of the first device, work
// that faults with code when it runs: a kernel of an execution provider
// touching memory it should not. As on a GPU the error is sticky and is
// reported by the next call that waits for the work (a synchronize, an event
// query), then by every call that needs the context.
func (s *Sim) Fault(code driver.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.enqueue(s.devs[0], 0, func() driver.Result { return code })
}
