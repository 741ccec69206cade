package cudasim

import "github.com/memgen/memgen/mechanisms/cuda/driver"

// cNames holds each known code's name as a NUL-terminated byte string that
// lives for the whole process, as cuGetErrorName's static strings do.
var cNames = func() map[driver.Result][]byte {
	m := map[driver.Result][]byte{}
	for _, r := range []driver.Result{
		driver.Success, driver.ErrInvalidValue, driver.ErrOutOfMemory, driver.ErrNotInitialized,
		driver.ErrDeinitialized, driver.ErrStubLibrary, driver.ErrInsufficientDrv,
		driver.ErrDeviceUnavailable, driver.ErrNoDevice, driver.ErrInvalidDevice,
		driver.ErrInvalidContext, driver.ErrInvalidHandle, driver.ErrNotReady,
		driver.ErrIllegalAddress, driver.ErrNotSupported, driver.ErrUnknown,
	} {
		n, _ := r.Name()
		m[r] = append([]byte(n), 0)
	}
	return m
}()

// getErrorName is cuGetErrorName: it needs no initialisation and answers
// CUDA_ERROR_INVALID_VALUE (with a nil name) for a code it does not know.
func (s *Sim) getErrorName(code driver.Result, name **byte) driver.Result {
	s.mu.Lock()
	s.calls["cuGetErrorName"]++
	s.mu.Unlock()
	if name == nil {
		return driver.ErrInvalidValue
	}
	b, ok := cNames[code]
	if !ok {
		*name = nil
		return driver.ErrInvalidValue
	}
	*name = &b[0]
	return driver.Success
}
