// Package cuda is the memgen mechanism for NVIDIA GPU memory, through the
// CUDA driver API loaded at run time (package driver: purego, no cgo, no CUDA
// headers), with a simulated driver (package cudasim) so that it builds and
// its tests run on machines with no GPU.
//
// # Capabilities
//
//   - DeviceAllocator over cuMemAlloc_v2 / cuMemFree_v2. Sizes are rounded up
//     to Info().AllocGranularity, which defaults to the device's VMM
//     granularity (2 MiB on current GPUs), and the rounded size is what the
//     driver is asked for. The driver's pool hands out small blocks inside
//     2 MiB pages, so charging 2 MiB per allocation makes UsedBytes what the
//     device really holds; a runtime with many small tensors sub-allocates
//     inside one allocation (an arena), as inference runtimes do. A smaller
//     Config.AllocGranularity (a power of two of at least 256) trades that
//     honesty for less rounding.
//   - VirtualBacking over cuMemAddressReserve / cuMemCreate / cuMemMap /
//     cuMemSetAccess / cuMemUnmap / cuMemRelease / cuMemAddressFree at the
//     granularity of cuMemGetAllocationGranularity. A mapping can only be
//     unmapped whole, so Commit installs one physical handle per granularity
//     chunk, maps each, grants access to the whole range with one
//     cuMemSetAccess and clears it (cuMemsetD8_v2: fresh backing reads zeros,
//     and pooled handles hold their last user's bytes).
//   - SharedMapping over one cuMemCreate handle mapped at several addresses,
//     each view with its own access (CU_MEM_ACCESS_FLAGS_PROT_READ or
//     PROT_READWRITE). CopyOnWrite maps a new handle at a scratch range, copies
//     with cuMemcpyDtoD, and remaps it read-write in the view's place.
//
// The VMM capabilities are absent, not no-ops, when the device reports
// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (102) as 0.
//
// # Handle pool
//
// cuMemCreate is the slow VMM call (about 200 µs per 2 MiB on an A100), so
// the mechanism keeps up to Config.PoolChunks (default 4) granularity-sized
// handles, created by New and refilled by Decommit and ReleaseBacking. The
// pool's bytes are the mechanism's own overhead: they are not in UsedBytes
// (which is what the ledger charged: allocations + committed + backings), they
// are reported by PooledBytes, and PoolLimit bounds them, so the authority's
// capacity is the device memory less PoolLimit. The checked wrapper's verify
// mode stays truthful: a Commit served from the pool moves UsedBytes and
// CommittedBytes by exactly the committed bytes.
//
// Up to Config.SpareChunks of the pool's chunks stay mapped, read-write, at
// the chunk where a reservation grows next (mapped by a refiller goroutine
// off the caller's path, outside the lock) or where a Decommit left them, so
// the next Commit there costs one cuMemsetD8 (see spare.go). Commit and
// Decommit hold the mechanism's lock only to claim and to settle their
// chunks; their driver calls run without it.
//
// # Threads, errors, failures
//
// The CUDA context is current per OS thread, so every driver call of a device
// runs on one goroutine locked to its OS thread with the device's primary
// context current; mechanisms on the same device share it. Every CUresult
// other than CUDA_SUCCESS becomes a *DriverError (call, code, name from
// cuGetErrorName) that wraps the memapi sentinel of the code (Kind), inside a
// *memapi.Error with the operation and the figures. Multi-call operations are
// transactions: when a call fails, the calls made so far are undone, so the
// previous state and the ledger stay as they were. A sticky error
// (CUDA_ERROR_ILLEGAL_ADDRESS, LAUNCH_TIMEOUT, ASSERT and the launch faults,
// see Sticky) is ErrUnavailable and marks the device lost, whether a call or
// a fence met it: every later operation fails with it. Work the driver runs after the call returns (memsets, device copies,
// host-to-device DMA) is waited for before any memory is unmapped. PinDevice
// keeps a device's primary context alive between mechanisms.
//
// When CUDA cannot run here, New returns an *UnavailableError (matching
// memapi.ErrUnavailable) saying why: no libcuda.so.1, a missing symbol, the
// stub library (CUDA_ERROR_STUB_LIBRARY) or no device (CUDA_ERROR_NO_DEVICE).
//
// # Device context
//
// Mechanism.NewContext returns the memapi.DeviceContext of the mechanism's
// memory: a CUstream per stream and a CUevent per fence (poll-only: Ready is
// nil; Wait polls cuEventQuery with a backoff, whatever its context, so it
// never holds the device thread; a failed query completes the fence with the
// error).
// Copies are driver copies run in stream order on the device thread; a
// host-to-device copy stages its buffer before it returns, so a Go buffer is
// never read after the call that passed it. Before a copy the context checks the range against the
// mechanism's own map and refuses, with ErrInvalidRange, ErrNotCommitted or
// ErrReadOnly, what the GPU would fault on: a fault there is a sticky error
// that ends the CUDA context for the whole process.
//
// See docs/cuda.md for the simulator's rules and scripts/gpu-check.sh for the
// run on a GPU.
package cuda
