package cuda

import (
	"strconv"
	"sync"

	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// DevicePin keeps a device open between mechanisms: its thread, and the
// primary context that thread retains. Without one, closing the last
// mechanism of a device releases the primary context, which destroys it and
// everything made in it, and the next New creates it again (about as slow
// as a cuInit). A process that opens and closes mechanisms often, such as a
// test binary, pins each device once for its whole life.
type DevicePin struct {
	d    *device
	once sync.Once
}

// PinDevice opens the device of cfg (cfg.Ordinal on cfg.Driver, or on
// libcuda.so.1 when nil) and keeps it open until Close. Mechanisms made with
// the same driver table and ordinal share it. When CUDA cannot run here it
// returns an *UnavailableError, as New does.
func PinDevice(cfg Config) (*DevicePin, error) {
	t := cfg.Driver
	if t == nil {
		var err error
		if t, err = driver.Open(); err != nil {
			return nil, unavailableLoad(err)
		}
	}
	if cfg.Ordinal < 0 {
		return nil, &UnavailableError{Reason: NoDevice, Detail: "ordinal " + strconv.Itoa(cfg.Ordinal)}
	}
	d, err := openDevice(t, cfg.Ordinal)
	if err != nil {
		return nil, err
	}
	return &DevicePin{d: d}, nil
}

// Close drops the pin's reference: the device closes (its primary context
// released) when no mechanism uses it either. It is idempotent.
func (p *DevicePin) Close() error {
	p.once.Do(p.d.release)
	return nil
}
