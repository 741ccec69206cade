package cudasim

import (
	"unsafe"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// resolve returns the host bytes behind device range [addr, addr+n) of
// device d, in address order. The range must lie in one live cuMemAlloc block
// or in mapped memory of one reservation. A hole is CUDA_ERROR_INVALID_VALUE;
// a mapping without access, or a write through a PROT_READ mapping, is a fault
// (CUDA_ERROR_ILLEGAL_ADDRESS). Nothing is copied unless the whole range
// resolves. It runs when the copy runs: at the call for a synchronous copy,
// later for queued work (see work).
func (s *Sim) resolve(d *device, addr, n uint64, write bool) ([][]byte, driver.Result) {
	end := addr + n
	if end < addr {
		return nil, driver.ErrInvalidValue
	}
	if b := s.findBlock(addr); b != nil {
		off := addr - b.addr
		if b.dev != d || end > b.addr+b.size {
			return nil, driver.ErrInvalidValue
		}
		return [][]byte{b.mem()[off : off+n]}, driver.Success
	}
	res := s.findReservation(addr)
	if res == nil || res.dev != d || end > res.addr+res.size {
		return nil, driver.ErrInvalidValue
	}
	var segs [][]byte
	fault := false
	for cur := addr; cur < end; {
		i := res.find(cur)
		if i < 0 {
			return nil, driver.ErrInvalidValue
		}
		m := res.maps[i]
		if m.access == driver.MemAccessProtNone || (write && m.access != driver.MemAccessProtReadWrite) {
			fault = true
		}
		off := cur - m.addr
		take := min(m.size-off, end-cur)
		segs = append(segs, m.phys.mem()[m.off+off:m.off+off+take])
		cur += take
	}
	if fault {
		return nil, driver.ErrIllegalAddress
	}
	return segs, driver.Success
}

// check validates a range at the call that enqueues work on it: what the
// driver can refuse at once (an address it does not know, a hole) is
// CUDA_ERROR_INVALID_VALUE there; a fault is the device's and is reported
// when the work runs.
func (s *Sim) check(d *device, addr, n uint64, write bool) driver.Result {
	if _, r := s.resolve(d, addr, n, write); r == driver.ErrInvalidValue {
		return r
	}
	return driver.Success
}

// runCopy applies a queued copy of n bytes when it runs: src gives the
// bytes, dst is resolved then.
func (s *Sim) runCopy(d *device, dst uint64, src func() ([]byte, driver.Result), n uint64) driver.Result {
	data, r := src()
	if r != driver.Success {
		return r
	}
	to, r := s.resolve(d, dst, n, true)
	if r != driver.Success {
		return driver.ErrIllegalAddress // the device met it: a fault
	}
	scatter(to, data)
	return driver.Success
}

func scatter(segs [][]byte, src []byte) {
	for _, seg := range segs {
		src = src[copy(seg, src):]
	}
}

func gather(dst []byte, segs [][]byte) {
	for _, seg := range segs {
		dst = dst[copy(dst, seg):]
	}
}

// memcpyHtoD is cuMemcpyHtoD_v2. From pageable memory "a stream sync is
// performed before the copy is initiated. The function will return once the
// pageable buffer has been copied to the staging memory for DMA transfer to
// device memory, but the DMA to final destination may not have completed"
// (api-sync-behavior): the simulator runs the pending work, stages the bytes
// and queues the DMA.
func (s *Sim) memcpyHtoD(dst driver.DevicePtr, src unsafe.Pointer, n uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemcpyHtoD", true)
	if r != driver.Success {
		return r
	}
	if n == 0 {
		return driver.Success
	}
	if src == nil {
		return driver.ErrInvalidValue
	}
	if r := s.check(d, uint64(dst), n, true); r != driver.Success {
		return r
	}
	if r := s.runAll(); r != driver.Success {
		return r
	}
	staged := append([]byte(nil), unsafe.Slice((*byte)(src), n)...)
	s.enqueue(d, 0, func() driver.Result {
		return s.runCopy(d, uint64(dst), func() ([]byte, driver.Result) { return staged, driver.Success }, n)
	}, span{uint64(dst), n})
	return driver.Success
}

// memcpyDtoH is cuMemcpyDtoH_v2: "For transfers from device to either
// pageable or pinned host memory, the function returns only once the copy has
// completed" (api-sync-behavior), so the work before it runs first.
func (s *Sim) memcpyDtoH(dst unsafe.Pointer, src driver.DevicePtr, n uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemcpyDtoH", true)
	if r != driver.Success {
		return r
	}
	if n == 0 {
		return driver.Success
	}
	if dst == nil {
		return driver.ErrInvalidValue
	}
	if r := s.check(d, uint64(src), n, false); r != driver.Success {
		return r
	}
	if r := s.runAll(); r != driver.Success {
		return r
	}
	segs, r := s.resolve(d, uint64(src), n, false)
	if r != driver.Success {
		s.sticky = driver.ErrIllegalAddress
		return s.sticky
	}
	gather(unsafe.Slice((*byte)(dst), n), segs)
	return driver.Success
}

// memcpyDtoHAsync is cuMemcpyDtoHAsync_v2 into pageable memory: "For
// transfers from device memory to pageable host memory, the function will
// return only once the copy has completed" (api-sync-behavior), in the order
// of stream st. On the legacy stream or a blocking stream that order includes
// the legacy stream's work before it, so that work runs first. A stream made
// with CU_STREAM_NON_BLOCKING "may run concurrently with work in stream 0"
// and does not wait for it (driver API, cuStreamCreate): the copy reads what
// the memory holds now, before the memsets and copies still queued on the
// legacy stream, as a GPU may. (The simulator queues device work on the
// legacy stream only, so a non-blocking stream has none of its own to wait
// for.)
func (s *Sim) memcpyDtoHAsync(dst unsafe.Pointer, src driver.DevicePtr, n uint64, st driver.Stream) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemcpyDtoHAsync", true)
	if r != driver.Success {
		return r
	}
	str, ok := s.streams[st]
	if !ok && st != 0 {
		return driver.ErrInvalidHandle
	}
	if n == 0 {
		return driver.Success
	}
	if dst == nil {
		return driver.ErrInvalidValue
	}
	if r := s.check(d, uint64(src), n, false); r != driver.Success {
		return r
	}
	if st == 0 || !str.nonBlocking {
		if r := s.runAll(); r != driver.Success {
			return r
		}
	}
	segs, r := s.resolve(d, uint64(src), n, false)
	if r != driver.Success {
		s.sticky = driver.ErrIllegalAddress
		return s.sticky
	}
	gather(unsafe.Slice((*byte)(dst), n), segs)
	return driver.Success
}

// memcpyDtoD is cuMemcpyDtoD_v2; overlapping ranges copy as memmove does.
// "For transfers from device memory to device memory, no host-side
// synchronization is performed" (api-sync-behavior): it is queued work.
func (s *Sim) memcpyDtoD(dst, src driver.DevicePtr, n uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemcpyDtoD", true)
	if r != driver.Success {
		return r
	}
	if n == 0 {
		return driver.Success
	}
	if r := s.check(d, uint64(src), n, false); r != driver.Success {
		return r
	}
	if r := s.check(d, uint64(dst), n, true); r != driver.Success {
		return r
	}
	s.enqueue(d, 0, func() driver.Result {
		return s.runCopy(d, uint64(dst), func() ([]byte, driver.Result) {
			from, r := s.resolve(d, uint64(src), n, false)
			if r != driver.Success {
				return nil, driver.ErrIllegalAddress
			}
			tmp := make([]byte, n)
			gather(tmp, from)
			return tmp, driver.Success
		}, n)
	}, span{uint64(src), n}, span{uint64(dst), n})
	return driver.Success
}

// memsetD8 is cuMemsetD8_v2. "The synchronous memset functions are
// asynchronous with respect to the host except when the target is pinned
// host memory or a Unified Memory region" (api-sync-behavior): queued work.
func (s *Sim) memsetD8(dst driver.DevicePtr, v uint8, n uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemsetD8", true)
	if r != driver.Success {
		return r
	}
	if n == 0 {
		return driver.Success
	}
	if r := s.check(d, uint64(dst), n, true); r != driver.Success {
		return r
	}
	s.enqueue(d, 0, func() driver.Result {
		segs, r := s.resolve(d, uint64(dst), n, true)
		if r != driver.Success {
			return driver.ErrIllegalAddress
		}
		for _, seg := range segs {
			fill(seg, v)
		}
		return driver.Success
	}, span{uint64(dst), n})
	return driver.Success
}
