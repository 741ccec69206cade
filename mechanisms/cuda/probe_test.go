package cuda

import (
	"bytes"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/mechanisms/cuda/cudasim"
	"github.com/memgen/memgen/mechanisms/cuda/driver"
)

// The probes record driver facts that the documentation leaves open and the
// simulator had to assume. Each runs the same driver calls on a fresh
// simulator and, with MEMGEN_CUDA=real, on the device, and prints one row
//
//	GPU-PROBE | fact | simulator | device | same, DIFFERS, no device or -
//
// that scripts/gpu-check.sh gathers into a table. A device that differs from
// the simulator is reported loudly, never failed: the fact is what the run
// is for. A probe fails only when the simulator no longer gives the
// assumption it documents (that needs no device).

// probe describes one fact: what the simulator assumes, and the calls that
// observe it, run on a thread of their own (with the device's primary
// context current when ctx is set).
type probe struct {
	fact    string
	assumed string // the simulator's documented answer
	ctx     bool
	run     func(t *driver.Table, dev driver.Device) string
}

// probeTimeout bounds one side of a probe: a driver call that hangs is
// reported, and gpu-check's own bounds stop the binary.
const probeTimeout = time.Minute

func (p probe) check(t *testing.T) {
	t.Helper()
	rehearseHang(t)
	sim := onProbeThread(cudasim.New(cudasim.Config{}).Table(), p)
	if sim != p.assumed {
		t.Errorf("%s: the simulator gives %q, but documents %q", p.fact, sim, p.assumed)
	}
	dev, same := "not run (no MEMGEN_CUDA=real)", "-"
	if realDriver() {
		if tbl, err := driver.Open(); err != nil {
			dev, same = "driver did not load: "+err.Error(), "no device"
		} else {
			dev, same = onProbeThread(tbl, p), "same"
			if dev != sim {
				same = "DIFFERS"
				t.Logf("!! %s: the device gives %q, the simulator assumes %q", p.fact, dev, sim)
			}
		}
	}
	fmt.Printf("GPU-PROBE | %s | %s | %s | %s\n", p.fact, sim, dev, same)
}

// onProbeThread runs p on a new locked OS thread after cuInit and
// cuDeviceGet(0), with the primary context retained and current when p.ctx
// is set and no context current otherwise. The thread ends with the
// goroutine (it stays locked), so nothing it made current outlives it.
func onProbeThread(tb *driver.Table, p probe) string {
	out := make(chan string, 1)
	go func() {
		runtime.LockOSThread()
		if r := tb.Init(0); r != driver.Success {
			out <- "cuInit: " + tb.ErrorName(r)
			return
		}
		var dev driver.Device
		if r := tb.DeviceGet(&dev, 0); r != driver.Success {
			out <- "cuDeviceGet: " + tb.ErrorName(r)
			return
		}
		if r := tb.CtxSetCurrent(0); r != driver.Success {
			out <- "cuCtxSetCurrent(NULL): " + tb.ErrorName(r)
			return
		}
		if p.ctx {
			var ctx driver.Context
			if r := tb.DevicePrimaryCtxRetain(&ctx, dev); r != driver.Success {
				out <- "cuDevicePrimaryCtxRetain: " + tb.ErrorName(r)
				return
			}
			defer tb.DevicePrimaryCtxRelease(dev)
			if r := tb.CtxSetCurrent(ctx); r != driver.Success {
				out <- "cuCtxSetCurrent: " + tb.ErrorName(r)
				return
			}
			defer tb.CtxSetCurrent(0)
		}
		out <- p.run(tb, dev)
	}()
	select {
	case s := <-out:
		return s
	case <-time.After(probeTimeout):
		return fmt.Sprintf("no answer in %v", probeTimeout)
	}
}

// rehearseHang makes the probe whose name contains MEMGEN_REHEARSE_HANG
// sleep for an hour: it exists only to rehearse gpu-check's bounds (a test
// that hangs must not overrun the device's time), and the test binary's
// -test.timeout ends it.
func rehearseHang(t *testing.T) {
	if h := os.Getenv("MEMGEN_REHEARSE_HANG"); h != "" && strings.Contains(t.Name(), h) {
		t.Logf("MEMGEN_REHEARSE_HANG=%s: sleeping for an hour to rehearse the bounds", h)
		time.Sleep(time.Hour)
	}
}

// size writes n in the largest binary unit that divides it.
func size(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}

// alignment is the largest power of two dividing addr.
func alignment(addr uint64) string {
	if addr == 0 {
		return "0"
	}
	return size(1 << bits.TrailingZeros64(addr))
}

// The granularity query with no context current: the mechanism no longer
// relies on it, but a driver that refuses it would have failed every open.
func TestGPUProbeGranularityWithoutContext(t *testing.T) {
	probe{
		fact:    "cuMemGetAllocationGranularity with no current context",
		assumed: "CUDA_ERROR_INVALID_CONTEXT",
		run: func(tb *driver.Table, dev driver.Device) string {
			prop := driver.DeviceProp(dev)
			var g uint64
			r := tb.MemGetAllocationGranularity(&g, &prop, driver.MemAllocGranularityMinimum)
			if r != driver.Success {
				return tb.ErrorName(r)
			}
			return "CUDA_SUCCESS, " + size(g)
		},
	}.check(t)
}

// The sizes cuMemAddressReserve takes: the documentation asks for a multiple
// of the host page; a host page and a granularity plus a page test whether a
// GPU asks for more. (An H200 on driver 580.159.04 refused both.)
func TestGPUProbeReserveSize(t *testing.T) {
	probe{
		fact:    "cuMemAddressReserve of a size that is a host page multiple but not a granularity multiple",
		assumed: "4 KiB: CUDA_ERROR_INVALID_VALUE; 2 MiB+4 KiB: CUDA_ERROR_INVALID_VALUE",
		ctx:     true,
		run: func(tb *driver.Table, dev driver.Device) string {
			return reserveRows(tb, dev, []reserveSize{{"4 KiB", 4 << 10}, {"2 MiB+4 KiB", 2<<20 + 4<<10}})
		},
	}.check(t)
}

// The alignment cuMemAddressReserve gives with alignment 0, for three
// granularities and 1 TiB: the address's largest power-of-two divisor when
// it is a multiple of the granularity, else "under the granularity". The
// documentation gives no default, so the simulator gives the least.
func TestGPUProbeDefaultReservationAlignment(t *testing.T) {
	probe{
		fact:    "cuMemAddressReserve alignment 0: address alignment by size",
		assumed: "6 MiB: under the granularity; 1 TiB: under the granularity",
		ctx:     true,
		run: func(tb *driver.Table, dev driver.Device) string {
			return reserveRows(tb, dev, []reserveSize{{"6 MiB", 6 << 20}, {"1 TiB", 1 << 40}})
		},
	}.check(t)
}

type reserveSize struct {
	name string
	n    uint64
}

// reserveRows reserves each size at alignment 0 and says what came back:
// the driver's error, or the address's alignment (or "under the
// granularity"); it frees what it reserved.
func reserveRows(tb *driver.Table, dev driver.Device, sizes []reserveSize) string {
	prop := driver.DeviceProp(dev)
	var g uint64
	if r := tb.MemGetAllocationGranularity(&g, &prop, driver.MemAllocGranularityMinimum); r != driver.Success {
		return "cuMemGetAllocationGranularity: " + tb.ErrorName(r)
	}
	var rows []string
	for _, s := range sizes {
		var p driver.DevicePtr
		if r := tb.MemAddressReserve(&p, s.n, 0, 0, 0); r != driver.Success {
			rows = append(rows, s.name+": "+tb.ErrorName(r))
			continue
		}
		if uint64(p)%g == 0 {
			rows = append(rows, s.name+": "+alignment(uint64(p)))
		} else {
			rows = append(rows, s.name+": under the granularity")
		}
		if r := tb.MemAddressFree(p, s.n); r != driver.Success {
			rows = append(rows, "cuMemAddressFree: "+tb.ErrorName(r))
		}
	}
	return strings.Join(rows, "; ")
}

// Read-only access to device memory by its own device: cuMemSetAccess with
// PROT_READ, then a read through it. Nothing writes through it (on a GPU a
// faulting write would end the context for the whole run), and nothing
// reads unless the access was granted.
func TestGPUProbeReadOnlyAccess(t *testing.T) {
	probe{
		fact:    "cuMemSetAccess PROT_READ on device memory, then a read",
		assumed: "cuMemSetAccess: CUDA_SUCCESS; read: CUDA_SUCCESS",
		ctx:     true,
		run: func(tb *driver.Table, dev driver.Device) string {
			prop := driver.DeviceProp(dev)
			var g uint64
			if r := tb.MemGetAllocationGranularity(&g, &prop, driver.MemAllocGranularityMinimum); r != driver.Success {
				return "cuMemGetAllocationGranularity: " + tb.ErrorName(r)
			}
			var p driver.DevicePtr
			if r := tb.MemAddressReserve(&p, g, g, 0, 0); r != driver.Success {
				return "cuMemAddressReserve: " + tb.ErrorName(r)
			}
			defer tb.MemAddressFree(p, g)
			var h driver.MemHandle
			if r := tb.MemCreate(&h, g, &prop, 0); r != driver.Success {
				return "cuMemCreate: " + tb.ErrorName(r)
			}
			defer tb.MemRelease(h)
			if r := tb.MemMap(p, g, 0, h, 0); r != driver.Success {
				return "cuMemMap: " + tb.ErrorName(r)
			}
			defer tb.MemUnmap(p, g)
			ro := driver.MemAccessDesc{Location: driver.MemLocation{Type: driver.MemLocationTypeDevice, ID: int32(dev)}, Flags: driver.MemAccessProtRead}
			r := tb.MemSetAccess(p, g, &ro, 1)
			out := "cuMemSetAccess: " + tb.ErrorName(r)
			if r != driver.Success {
				return out + "; read: not tried"
			}
			buf := make([]byte, 64)
			return out + "; read: " + tb.ErrorName(tb.MemcpyDtoH(unsafe.Pointer(&buf[0]), p, uint64(len(buf))))
		},
	}.check(t)
}

// Whether a non-blocking stream waits for a memset queued on the legacy
// stream: 256 MiB set to 0xff (and waited for), then to 0 without waiting,
// and at once the last 4 KiB read from a CU_STREAM_NON_BLOCKING stream.
// Zeros only say the memset was done by then in this run; 0xff says the
// stream did not wait.
func TestGPUProbeMemsetOrderingNonBlocking(t *testing.T) {
	probe{
		fact:    "a non-blocking stream's read right after a legacy-stream cuMemsetD8",
		assumed: "read the old bytes: not ordered",
		ctx:     true,
		run: func(tb *driver.Table, _ driver.Device) string {
			const n, tail = 256 << 20, 4 << 10
			var p driver.DevicePtr
			if r := tb.MemAlloc(&p, n); r != driver.Success {
				return "cuMemAlloc: " + tb.ErrorName(r)
			}
			defer tb.MemFree(p)
			if r := tb.MemsetD8(p, 0xff, n); r != driver.Success {
				return "cuMemsetD8: " + tb.ErrorName(r)
			}
			if r := tb.StreamSynchronize(0); r != driver.Success {
				return "cuStreamSynchronize: " + tb.ErrorName(r)
			}
			var st driver.Stream
			if r := tb.StreamCreate(&st, driver.StreamNonBlocking); r != driver.Success {
				return "cuStreamCreate: " + tb.ErrorName(r)
			}
			defer tb.StreamDestroy(st)
			buf := make([]byte, tail)
			if r := tb.MemsetD8(p, 0, n); r != driver.Success {
				return "cuMemsetD8: " + tb.ErrorName(r)
			}
			r := tb.MemcpyDtoHAsync(unsafe.Pointer(&buf[0]), p+n-tail, tail, st)
			if r == driver.Success {
				r = tb.StreamSynchronize(st)
			}
			if r != driver.Success {
				return "cuMemcpyDtoHAsync: " + tb.ErrorName(r)
			}
			_ = tb.StreamSynchronize(0)
			switch {
			case bytes.Equal(buf, make([]byte, tail)):
				return "read zeros: ordered, or the memset was done"
			case bytes.Equal(buf, bytes.Repeat([]byte{0xff}, tail)):
				return "read the old bytes: not ordered"
			}
			return "read a mix: not ordered"
		},
	}.check(t)
}

// cuMemGetInfo's free memory around a mechanism's life on a pinned device
// (the context outlives the mechanism, as in a long-lived process): before
// New, after a commit of 64 MiB, and after Close. The simulator frees at
// once; a driver may hold freed memory, and other processes move the figure.
func TestGPUProbeMemInfoAroundClose(t *testing.T) {
	probe{
		fact:    "cuMemGetInfo free memory: change after New+commit of 64 MiB, after Close",
		assumed: "after commit: -64 MiB; after Close: +0 MiB",
		run: func(tb *driver.Table, _ driver.Device) string {
			pin, err := PinDevice(Config{Driver: tb})
			if err != nil {
				return "PinDevice: " + err.Error()
			}
			defer pin.Close()
			free := func() (int64, error) {
				var f, total uint64
				err := pin.d.do(func(t *driver.Table) error {
					return check(t, "cuMemGetInfo_v2", t.MemGetInfo(&f, &total))
				})
				return int64(f), err
			}
			before, err := free()
			if err != nil {
				return err.Error()
			}
			m, err := New(Config{Driver: tb, SpareChunks: -1})
			if err != nil {
				return "New: " + err.Error()
			}
			commit := func() error {
				res, err := m.Reserve(bg, memapi.ReserveRequest{Size: 64 << 20})
				if err != nil {
					return err
				}
				return m.Commit(bg, res, memapi.Range{Len: 64 << 20}, grantFor(m))
			}
			if err := commit(); err != nil {
				_ = m.Close()
				return "commit: " + err.Error()
			}
			during, err := free()
			if err != nil {
				_ = m.Close()
				return err.Error()
			}
			_ = m.Close() // reports the reservation it released: expected here
			after, err := free()
			if err != nil {
				return err.Error()
			}
			return fmt.Sprintf("after commit: %+d MiB; after Close: %+d MiB", (during-before)>>20, (after-before)>>20)
		},
	}.check(t)
}
