package cudasim

import (
	"slices"
	"unsafe"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// memAlloc is cuMemAlloc_v2: the block is charged whole pages (AllocPage)
// and reads as poison until written (its bytes are made at the first
// access). Its address is aligned to 256 bytes and no more:
// the CUDA programming guide promises that an address "returned by one of
// the memory allocation routines from the driver or runtime API is always
// aligned to at least 256 bytes", so code that relies on more fails here.
func (s *Sim) memAlloc(dptr *driver.DevicePtr, size uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemAlloc", true)
	if r != driver.Success {
		return r
	}
	if dptr == nil || size == 0 {
		return driver.ErrInvalidValue
	}
	charged := roundUp(size, s.cfg.AllocPage)
	if charged < size || !s.charge(d, charged) {
		return driver.ErrOutOfMemory
	}
	b := &block{dev: d, addr: s.nextAlloc + allocAlign, charged: charged, size: size}
	s.nextAlloc += charged + s.cfg.AllocPage // a guard page: overruns hit nothing
	s.allocs = append(s.allocs, b)           // addresses only grow: stays sorted
	*dptr = driver.DevicePtr(b.addr)
	return driver.Success
}

// memFree is cuMemFree_v2: ptr must be the start of a live block. Unlike
// cuMemUnmap, freeing waits for the work before it (PyTorch: "unlike
// cudaFree, MemUnmap and MemRelease do not appear to synchronize in all
// cases"), so the simulator runs the pending work first.
func (s *Sim) memFree(ptr driver.DevicePtr) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemFree", true)
	if r != driver.Success {
		return r
	}
	if r := s.runAll(); r != driver.Success {
		return r
	}
	i := slices.IndexFunc(s.allocs, func(b *block) bool { return b.addr == uint64(ptr) && b.dev == d })
	if i < 0 {
		return driver.ErrInvalidValue
	}
	s.uncharge(d, s.allocs[i].charged)
	s.allocs = slices.Delete(s.allocs, i, i+1)
	return driver.Success
}

// vmm enters a VMM entry point: on a device without VMM they all fail with
// CUDA_ERROR_NOT_SUPPORTED. The VMM calls name their device through their
// arguments (the allocation properties, the handle, the access
// descriptors), and the driver documentation does not say that they need a
// current context; but it does not say that they do not, and a driver that
// wants one answers CUDA_ERROR_INVALID_CONTEXT. The simulator takes the
// strict side: every VMM call needs a current context on the calling
// thread, so code that makes one before its context fails here rather than
// on a GPU. d is that context's device. A sticky error fails them too, as it
// fails "any further CUDA work".
func (s *Sim) vmm(call string) (*device, driver.Result) {
	d, r := s.enter(call, true)
	if r != driver.Success {
		return nil, r
	}
	if s.cfg.NoVMM {
		return nil, driver.ErrNotSupported
	}
	return d, driver.Success
}

func (s *Sim) aligned(n uint64) bool { return n%s.cfg.Granularity == 0 }

// hostPage is the host page size the reservation rules are stated in.
const hostPage = 4096

// memAddressReserve is cuMemAddressReserve: "The size and address parameters
// must be a multiple of the host page size and the alignment must be a power
// of two or zero for default alignment" (driver API, cuMemAddressReserve);
// "flags: Currently unused, must be zero". A GPU is stricter than that line
// about the size: an H200 on driver 580.159.04 refused 4 KiB and
// 2 MiB + 4 KiB with CUDA_ERROR_INVALID_VALUE (TestGPUProbeReserveSize in the
// cuda package), so the simulator asks for a multiple of the granularity.
// The address hint is ignored ("the driver treats it as a hint"). The
// documentation does not say what the default alignment is, so with
// alignment 0 the simulator promises only the host page and gives no more:
// the address is a host page past a granularity boundary, and code that maps
// there without asking for the granularity fails at cuMemMap (the H200 gave
// 8 MiB for 6 MiB and 64 MiB for 1 TiB, but nothing documents that). With an
// alignment the address is a multiple of it. Reservations are not separated
// by gaps (none is documented either).
func (s *Sim) memAddressReserve(ptr *driver.DevicePtr, size, alignment uint64, _ driver.DevicePtr, flags uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.vmm("cuMemAddressReserve")
	if r != driver.Success {
		return r
	}
	if ptr == nil || size == 0 || size%hostPage != 0 || !s.aligned(size) || flags != 0 || alignment&(alignment-1) != 0 {
		return driver.ErrInvalidValue
	}
	var addr uint64
	if alignment == 0 {
		addr = roundUp(s.nextReserve, hostPage)
		if addr%s.cfg.Granularity == 0 {
			addr += hostPage
		}
	} else {
		addr = roundUp(s.nextReserve, max(alignment, hostPage))
	}
	s.nextReserve = addr + size
	s.reserved = append(s.reserved, &reservation{dev: d, addr: addr, size: size})
	*ptr = driver.DevicePtr(addr)
	return driver.Success
}

// memAddressFree is cuMemAddressFree: the range must be exactly one
// reservation, with nothing mapped in it.
func (s *Sim) memAddressFree(ptr driver.DevicePtr, size uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.vmm("cuMemAddressFree"); r != driver.Success {
		return r
	}
	i := slices.IndexFunc(s.reserved, func(r *reservation) bool { return r.addr == uint64(ptr) })
	if i < 0 || s.reserved[i].size != size || len(s.reserved[i].maps) > 0 {
		return driver.ErrInvalidValue
	}
	s.reserved = slices.Delete(s.reserved, i, i+1)
	return driver.Success
}

// checkProp validates the allocation properties cuMemCreate and
// cuMemGetAllocationGranularity take: pinned device memory with no
// exportable handle type, on an existing device.
func (s *Sim) checkProp(prop *driver.MemAllocationProp) (*device, driver.Result) {
	if prop == nil || prop.Type != driver.MemAllocationTypePinned ||
		prop.Location.Type != driver.MemLocationTypeDevice || prop.RequestedHandleTypes != driver.MemHandleTypeNone {
		return nil, driver.ErrInvalidValue
	}
	d := s.device(driver.Device(prop.Location.ID))
	if d == nil {
		return nil, driver.ErrInvalidDevice
	}
	return d, driver.Success
}

// memGetAllocationGranularity is cuMemGetAllocationGranularity. Like the
// other VMM calls (see vmm) it needs a current context here.
func (s *Sim) memGetAllocationGranularity(g *uint64, prop *driver.MemAllocationProp, option int32) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuMemGetAllocationGranularity", true); r != driver.Success {
		return r
	}
	if s.cfg.NoVMM {
		return driver.ErrNotSupported
	}
	if _, r := s.checkProp(prop); r != driver.Success {
		return r
	}
	if g == nil || (option != driver.MemAllocGranularityMinimum && option != driver.MemAllocGranularityRecommended) {
		return driver.ErrInvalidValue
	}
	*g = s.cfg.Granularity
	return driver.Success
}

// memCreate is cuMemCreate: size a positive multiple of the granularity,
// charged to the device named by prop.
func (s *Sim) memCreate(h *driver.MemHandle, size uint64, prop *driver.MemAllocationProp, flags uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.vmm("cuMemCreate"); r != driver.Success {
		return r
	}
	d, r := s.checkProp(prop)
	if r != driver.Success {
		return r
	}
	if h == nil || flags != 0 || size == 0 || !s.aligned(size) {
		return driver.ErrInvalidValue
	}
	if !s.charge(d, size) {
		return driver.ErrOutOfMemory
	}
	id := driver.MemHandle(s.id())
	s.phys[id] = &physical{handle: id, dev: d, size: size}
	*h = id
	return driver.Success
}

// memRelease is cuMemRelease: the handle becomes unusable at once; "Any
// backing memory allocations will be freed if there are no existing
// mappings and there are no unreleased memory handles" (driver API,
// cuMemUnmap): its memory is freed when its last mapping is gone.
func (s *Sim) memRelease(h driver.MemHandle) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.vmm("cuMemRelease"); r != driver.Success {
		return r
	}
	p, ok := s.phys[h]
	if !ok || p.released {
		return driver.ErrInvalidValue
	}
	p.released = true
	s.freeIfDone(p)
	return driver.Success
}

// freeIfDone frees p once it is released and mapped nowhere.
func (s *Sim) freeIfDone(p *physical) {
	if p.released && p.mappings == 0 {
		s.uncharge(p.dev, p.size)
		p.data = nil
		delete(s.phys, p.handle)
	}
}

// memMap is cuMemMap. The driver API: the range "must be an address
// reservation previously reserved with cuMemAddressReserve, and offset +
// size must be less than the size of the memory allocation. Both ptr, size,
// and offset must be a multiple of the value given via
// cuMemGetAllocationGranularity"; flags "must be zero now"; and "calling
// cuMemMap does not make the address accessible": the new mapping has no
// access until cuMemSetAccess. (Mapping over an existing mapping is refused
// too: a VA maps one allocation.)
func (s *Sim) memMap(ptr driver.DevicePtr, size, offset uint64, h driver.MemHandle, flags uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.vmm("cuMemMap"); r != driver.Success {
		return r
	}
	addr := uint64(ptr)
	p, ok := s.phys[h]
	switch {
	case flags != 0, size == 0, !s.aligned(addr), !s.aligned(size), !s.aligned(offset):
		return driver.ErrInvalidValue
	case !ok || p.released, offset+size < size, offset+size > p.size:
		return driver.ErrInvalidValue
	}
	res := s.findReservation(addr)
	if res == nil || addr+size < addr || addr+size > res.addr+res.size {
		return driver.ErrInvalidValue
	}
	for _, m := range res.maps {
		if addr < m.addr+m.size && m.addr < addr+size {
			return driver.ErrInvalidValue
		}
	}
	m := &mapping{addr: addr, size: size, off: offset, phys: p, access: driver.MemAccessProtNone}
	i, _ := slices.BinarySearchFunc(res.maps, addr, func(m *mapping, a uint64) int {
		switch {
		case m.addr < a:
			return -1
		case m.addr > a:
			return 1
		}
		return 0
	})
	res.maps = slices.Insert(res.maps, i, m)
	p.mappings++
	return driver.Success
}

// memUnmap is cuMemUnmap: "The range must be the entire contiguous address
// range that was mapped to. In other words, cuMemUnmap cannot unmap a
// sub-range" (driver API). Pending work over the range is not waited for
// (see Sim.unmapping).
func (s *Sim) memUnmap(ptr driver.DevicePtr, size uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.vmm("cuMemUnmap"); r != driver.Success {
		return r
	}
	addr := uint64(ptr)
	res := s.findReservation(addr)
	if res == nil {
		return driver.ErrInvalidValue
	}
	i := res.find(addr)
	if i < 0 || res.maps[i].addr != addr || res.maps[i].size != size {
		return driver.ErrInvalidValue
	}
	p := res.maps[i].phys
	s.unmapping(addr, size)
	res.maps = slices.Delete(res.maps, i, i+1)
	p.mappings--
	s.freeIfDone(p)
	return driver.Success
}

// memSetAccess is cuMemSetAccess: "The range must be a fully mapped address
// range containing all allocations created by cuMemMap / cuMemCreate"
// (driver API), so it covers each mapping in it whole; each descriptor names
// an existing device that owns the memory and a CUmemAccess_flags value.
func (s *Sim) memSetAccess(ptr driver.DevicePtr, size uint64, desc *driver.MemAccessDesc, count uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.vmm("cuMemSetAccess"); r != driver.Success {
		return r
	}
	addr := uint64(ptr)
	if desc == nil || count == 0 || count > uint64(len(s.devs)) || size == 0 || !s.aligned(addr) || !s.aligned(size) {
		return driver.ErrInvalidValue
	}
	descs := unsafe.Slice(desc, count)
	res := s.findReservation(addr)
	if res == nil || addr+size > res.addr+res.size {
		return driver.ErrInvalidValue
	}
	var covered []*mapping
	for cur := addr; cur < addr+size; {
		i := res.find(cur)
		if i < 0 || res.maps[i].addr != cur || cur+res.maps[i].size > addr+size {
			return driver.ErrInvalidValue // a hole, or a mapping not covered whole
		}
		covered = append(covered, res.maps[i])
		cur += res.maps[i].size
	}
	flags := int32(-1)
	for _, dsc := range descs {
		if dsc.Location.Type != driver.MemLocationTypeDevice {
			return driver.ErrInvalidValue
		}
		dev := s.device(driver.Device(dsc.Location.ID))
		if dev == nil {
			return driver.ErrInvalidDevice
		}
		switch dsc.Flags {
		case driver.MemAccessProtNone, driver.MemAccessProtRead, driver.MemAccessProtReadWrite:
		default:
			return driver.ErrInvalidValue
		}
		for _, m := range covered {
			if dev != m.phys.dev {
				return driver.ErrNotSupported // peer access is not simulated
			}
		}
		flags = dsc.Flags
	}
	for _, m := range covered {
		m.access = flags
	}
	return driver.Success
}
