package cudasim

import (
	"unsafe"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// resolve returns the host bytes behind device range [addr, addr+n) of
// device d, in address order. The range must lie in one live cuMemAlloc block
// or in mapped memory of one reservation. A hole is CUDA_ERROR_INVALID_VALUE;
// a mapping without access, or a write through a PROT_READ mapping, is a fault
// (CUDA_ERROR_ILLEGAL_ADDRESS) that becomes sticky. Nothing is copied unless
// the whole range resolves.
func (s *Sim) resolve(d *device, addr, n uint64, write bool) ([][]byte, driver.Result) {
	end := addr + n
	if end < addr {
		return nil, driver.ErrInvalidValue
	}
	if b := s.findBlock(addr); b != nil {
		off := addr - b.addr
		if b.dev != d || end > b.addr+uint64(len(b.data)) {
			return nil, driver.ErrInvalidValue
		}
		return [][]byte{b.data[off : off+n]}, driver.Success
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
		segs = append(segs, m.phys.data[off:off+take])
		cur += take
	}
	if fault {
		s.sticky = driver.ErrIllegalAddress
		return nil, driver.ErrIllegalAddress
	}
	return segs, driver.Success
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

// memcpyHtoD is cuMemcpyHtoD_v2.
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
	segs, r := s.resolve(d, uint64(dst), n, true)
	if r != driver.Success {
		return r
	}
	scatter(segs, unsafe.Slice((*byte)(src), n))
	return driver.Success
}

// memcpyDtoH is cuMemcpyDtoH_v2.
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
	segs, r := s.resolve(d, uint64(src), n, false)
	if r != driver.Success {
		return r
	}
	gather(unsafe.Slice((*byte)(dst), n), segs)
	return driver.Success
}

// memcpyDtoD is cuMemcpyDtoD_v2; overlapping ranges copy as memmove does.
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
	from, r := s.resolve(d, uint64(src), n, false)
	if r != driver.Success {
		return r
	}
	to, r := s.resolve(d, uint64(dst), n, true)
	if r != driver.Success {
		return r
	}
	tmp := make([]byte, n)
	gather(tmp, from)
	scatter(to, tmp)
	return driver.Success
}

// memsetD8 is cuMemsetD8_v2.
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
	segs, r := s.resolve(d, uint64(dst), n, true)
	if r != driver.Success {
		return r
	}
	for _, seg := range segs {
		fill(seg, v)
	}
	return driver.Success
}
