package cudasim

import (
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// initDriver is cuInit.
func (s *Sim) initDriver(flags uint32) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls["cuInit"]++
	if !s.faults.Empty() {
		if err := s.faults.MaybeError(memapi.Op{Layer: Layer, Name: "cuInit", Call: s.calls["cuInit"]}); err != nil {
			return resultOf(err)
		}
	}
	switch {
	case flags != 0:
		return driver.ErrInvalidValue
	case s.cfg.Stub:
		return driver.ErrStubLibrary
	case s.cfg.NoDevice:
		return driver.ErrNoDevice
	}
	s.initialized = true
	return driver.Success
}

func (s *Sim) device(dev driver.Device) *device {
	if dev < 0 || int(dev) >= len(s.devs) {
		return nil
	}
	return s.devs[dev]
}

// deviceGet is cuDeviceGet.
func (s *Sim) deviceGet(dev *driver.Device, ordinal int32) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuDeviceGet", false); r != driver.Success {
		return r
	}
	if dev == nil {
		return driver.ErrInvalidValue
	}
	if s.device(driver.Device(ordinal)) == nil {
		return driver.ErrInvalidDevice
	}
	*dev = driver.Device(ordinal)
	return driver.Success
}

// deviceGetAttribute is cuDeviceGetAttribute; the simulator knows attribute
// 102 (VMM supported) only, and answers CUDA_ERROR_INVALID_VALUE for others.
func (s *Sim) deviceGetAttribute(pi *int32, attr driver.DeviceAttr, dev driver.Device) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuDeviceGetAttribute", false); r != driver.Success {
		return r
	}
	if s.device(dev) == nil {
		return driver.ErrInvalidDevice
	}
	if pi == nil || attr != driver.AttrVirtualMemoryManagementSupported {
		return driver.ErrInvalidValue
	}
	*pi = 1
	if s.cfg.NoVMM {
		*pi = 0
	}
	return driver.Success
}

// primaryCtxRetain is cuDevicePrimaryCtxRetain.
func (s *Sim) primaryCtxRetain(pctx *driver.Context, dev driver.Device) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuDevicePrimaryCtxRetain", false); r != driver.Success {
		return r
	}
	d := s.device(dev)
	if d == nil {
		return driver.ErrInvalidDevice
	}
	if pctx == nil {
		return driver.ErrInvalidValue
	}
	d.refs++
	*pctx = d.ctx
	return driver.Success
}

// primaryCtxRelease is cuDevicePrimaryCtxRelease_v2. Dropping the last
// reference destroys the context and everything made in it, as the driver does.
func (s *Sim) primaryCtxRelease(dev driver.Device) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuDevicePrimaryCtxRelease", false); r != driver.Success {
		return r
	}
	d := s.device(dev)
	if d == nil {
		return driver.ErrInvalidDevice
	}
	if d.refs == 0 {
		return driver.ErrInvalidContext
	}
	d.refs--
	if d.refs == 0 {
		s.destroy(d)
	}
	return driver.Success
}

// destroy drops every resource made in d's primary context.
func (s *Sim) destroy(d *device) {
	keepBlocks := s.allocs[:0]
	for _, b := range s.allocs {
		if b.dev != d {
			keepBlocks = append(keepBlocks, b)
		}
	}
	s.allocs = keepBlocks
	keepRes := s.reserved[:0]
	for _, r := range s.reserved {
		if r.dev != d {
			keepRes = append(keepRes, r)
		}
	}
	s.reserved = keepRes
	for h, p := range s.phys {
		if p.dev == d {
			delete(s.phys, h)
		}
	}
	for h, st := range s.streams {
		if st.dev == d {
			delete(s.streams, h)
		}
	}
	for h, e := range s.events {
		if e.dev == d {
			delete(s.events, h)
		}
	}
	s.dropWork(d)
	s.uncharge(d, d.used)
	s.cond.Broadcast()
}

// ctxSetCurrent is cuCtxSetCurrent: the context becomes current on the
// calling OS thread only; 0 unbinds it.
func (s *Sim) ctxSetCurrent(ctx driver.Context) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, r := s.enter("cuCtxSetCurrent", false); r != driver.Success {
		return r
	}
	tid := threadID()
	if ctx == 0 {
		delete(s.current, tid)
		return driver.Success
	}
	for _, d := range s.devs {
		if d.ctx == ctx && d.refs > 0 {
			s.current[tid] = ctx
			return driver.Success
		}
	}
	return driver.ErrInvalidContext
}

// memGetInfo is cuMemGetInfo_v2 for the current context's device.
func (s *Sim) memGetInfo(free, total *uint64) driver.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, r := s.enter("cuMemGetInfo", true)
	if r != driver.Success {
		return r
	}
	if free == nil || total == nil {
		return driver.ErrInvalidValue
	}
	*total = s.cfg.Memory
	*free = s.cfg.Memory - d.used
	if s.cfg.Pool != nil {
		*free = min(*free, s.cfg.Pool.Free())
	}
	return driver.Success
}
