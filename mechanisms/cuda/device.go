package cuda

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// device is one CUDA device opened through one driver table: a goroutine
// locked to its OS thread, with the device's primary context current, that
// runs every driver call for the device. The CUDA context is current per OS
// thread, so calls made anywhere else could run with no context, or another.
// Mechanisms on the same device and table share it (reference counted).
type device struct {
	key     deviceKey
	t       *driver.Table
	dev     driver.Device
	vmm     bool   // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	gran    uint64 // cuMemGetAllocationGranularity (minimum), when vmm
	total   uint64 // the device's memory (cuMemGetInfo_v2 total)
	calls   chan func(*driver.Table)
	stop    chan struct{}
	done    chan struct{} // closed when the thread has exited
	refs    int           // guarded by devicesMu
	stopped bool          // guarded by devicesMu

	// unsynced says that work was enqueued on the legacy default stream
	// (memsets, device-to-device copies, host-to-device DMA) and not waited
	// for since. Only the device thread touches it.
	unsynced bool

	// lost holds the first sticky error (see Sticky) a call met: the
	// context is lost, and every later operation fails with ErrUnavailable
	// before it reaches the driver.
	lost atomic.Pointer[DriverError]
}

type deviceKey struct {
	t       *driver.Table
	ordinal int
}

var (
	devicesMu sync.Mutex
	devices   = map[deviceKey]*device{}
)

// openDevice returns the device thread for (t, ordinal), starting it when
// it is not running: cuInit, cuDeviceGet, the VMM attribute,
// cuDevicePrimaryCtxRetain, cuCtxSetCurrent, then the granularity and the
// memory, all on the locked thread.
func openDevice(t *driver.Table, ordinal int) (*device, error) {
	devicesMu.Lock()
	defer devicesMu.Unlock()
	key := deviceKey{t, ordinal}
	if d, ok := devices[key]; ok {
		d.refs++
		return d, nil
	}
	d := &device{
		key:   key,
		t:     t,
		calls: make(chan func(*driver.Table)),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		refs:  1,
	}
	ready := make(chan error, 1)
	go d.serve(ordinal, ready)
	if err := <-ready; err != nil {
		<-d.done
		return nil, err
	}
	devices[key] = d
	return d, nil
}

func (d *device) serve(ordinal int, ready chan<- error) {
	defer close(d.done)
	// The goroutine stays locked for its whole life; when it returns still
	// locked the runtime ends the OS thread, so no thread is left behind with
	// a CUDA context current.
	runtime.LockOSThread()
	err := d.start(ordinal)
	ready <- err
	if err != nil {
		return
	}
	for {
		select {
		case fn := <-d.calls:
			fn(d.t)
		case <-d.stop:
			_ = d.t.CtxSetCurrent(0)
			_ = d.t.DevicePrimaryCtxRelease(d.dev)
			return
		}
	}
}

// start opens the device on the calling (locked) thread: the primary
// context is retained and made current before anything that a driver may
// want a context for (the granularity query and cuMemGetInfo_v2; the
// documentation of cuMemGetAllocationGranularity does not say that it needs
// none), and released again if a later step fails.
func (d *device) start(ordinal int) error {
	t := d.t
	if err := check(t, "cuInit", t.Init(0)); err != nil {
		return unavailableInit(err)
	}
	if err := check(t, "cuDeviceGet", t.DeviceGet(&d.dev, int32(ordinal))); err != nil {
		return unavailableInit(err)
	}
	var vmm int32
	if err := check(t, "cuDeviceGetAttribute", t.DeviceGetAttribute(&vmm, driver.AttrVirtualMemoryManagementSupported, d.dev)); err != nil {
		return unavailableInit(err)
	}
	d.vmm = vmm != 0
	var ctx driver.Context
	if err := check(t, "cuDevicePrimaryCtxRetain", t.DevicePrimaryCtxRetain(&ctx, d.dev)); err != nil {
		return unavailableInit(err)
	}
	if err := check(t, "cuCtxSetCurrent", t.CtxSetCurrent(ctx)); err != nil {
		_ = t.DevicePrimaryCtxRelease(d.dev)
		return unavailableInit(err)
	}
	if err := d.query(t); err != nil {
		_ = t.CtxSetCurrent(0)
		_ = t.DevicePrimaryCtxRelease(d.dev)
		return err
	}
	return nil
}

// query reads, with the context current, the VMM granularity (when the
// device has VMM) and the device's memory.
func (d *device) query(t *driver.Table) error {
	if d.vmm {
		prop := driver.DeviceProp(d.dev)
		if err := check(t, "cuMemGetAllocationGranularity", t.MemGetAllocationGranularity(&d.gran, &prop, driver.MemAllocGranularityMinimum)); err != nil {
			return unavailableInit(err)
		}
		if d.gran == 0 || d.gran&(d.gran-1) != 0 {
			return &UnavailableError{Reason: DriverFailure, Detail: "granularity is not a power of two"}
		}
	}
	var free uint64
	if err := check(t, "cuMemGetInfo_v2", t.MemGetInfo(&free, &d.total)); err != nil {
		return unavailableInit(err)
	}
	return nil
}

// do runs fn on the device thread and returns its error, or an error of
// kind ErrClosed when the thread has stopped.
func (d *device) do(fn func(t *driver.Table) error) error {
	var err error
	finished := make(chan struct{})
	call := func(t *driver.Table) {
		defer close(finished)
		err = fn(t)
	}
	select {
	case d.calls <- call:
	case <-d.done:
		return memapi.Errorf("cuda", memapi.ErrClosed, "device thread stopped")
	}
	// The thread received the call: it runs it to the end before anything else.
	<-finished
	d.noteSticky(err)
	return err
}

// noteSticky marks the device lost when err is a sticky driver error (see
// Sticky), whoever met it: a call's result, or a fence's event.
func (d *device) noteSticky(err error) {
	var de *DriverError
	if err != nil && errors.As(err, &de) && Sticky(de.Code) {
		d.lost.CompareAndSwap(nil, de)
	}
}

// release drops one reference; the last one stops the thread, which releases
// the primary context, and waits for it to exit.
func (d *device) release() {
	devicesMu.Lock()
	d.refs--
	last := d.refs == 0 && !d.stopped
	if last {
		d.stopped = true
		delete(devices, d.key)
	}
	devicesMu.Unlock()
	if last {
		close(d.stop)
		<-d.done
	}
}

// queued notes, on the device thread, that a call enqueued work on the legacy
// default stream: the driver documents cuMemsetD8, cuMemcpyDtoD and pageable
// cuMemcpyHtoD as returning before the device has finished them.
func (d *device) queued() { d.unsynced = true }

// settle waits, on the device thread, for the work noted by queued
// (cuStreamSynchronize of the legacy default stream) before memory is
// unmapped: cuMemUnmap does not wait for work on the range (PyTorch's
// expandable segments synchronize first because it "does not appear to
// synchronize in all cases"), and work left running over an unmapped range
// faults the context. It costs nothing when no such work was enqueued.
func (d *device) settle(t *driver.Table) error {
	if !d.unsynced {
		return nil
	}
	if err := check(t, "cuStreamSynchronize", t.StreamSynchronize(0)); err != nil {
		return err
	}
	d.unsynced = false
	return nil
}

// unmap is cuMemUnmap after settle, for undo steps (which report nothing
// but the unmap's own result).
func (d *device) unmap(t *driver.Table, addr driver.DevicePtr, size uint64) driver.Result {
	_ = d.settle(t)
	return t.MemUnmap(addr, size)
}
