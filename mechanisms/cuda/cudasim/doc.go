// Package cudasim is a CUDA driver written in Go: it fills a driver.Table
// with functions that keep device memory in host memory and enforce the rules
// the real driver documents, returning the real CUresult codes. The cuda
// mechanism runs unchanged on it, so its tests and the generated conformance
// suite run in CI on machines with no GPU.
//
// Rules enforced (each has a test that breaking it gives the code shown, and
// each entry point's comment quotes the documentation line it follows; where
// the documentation is silent the simulator is the more lenient choice,
// except where code could come to rely on the lenient answer: whether the
// VMM calls need a context, the default reservation alignment, whether a
// non-blocking stream waits for the legacy stream. There it is the strict
// one, and the cuda package's TestGPUProbe* tests record what a GPU does):
//
//   - nothing but cuInit and cuGetErrorName works before cuInit
//     (CUDA_ERROR_NOT_INITIALIZED); cuInit reports a stub library or no device
//     when configured so (CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_NO_DEVICE);
//   - the context is current per OS thread: memory (cuMemAlloc, copies,
//     memsets), stream, event and VMM calls and the granularity query on a
//     thread with no current context fail (CUDA_ERROR_INVALID_CONTEXT), and
//     releasing the last reference to a primary context destroys everything
//     made in it. (The documentation does not say that the VMM calls need a
//     context; a driver may want one, so the simulator does.);
//   - cuMemAddressReserve: size a multiple of the granularity (the
//     documentation says the host page, but a GPU refuses less), alignment a
//     power of two or zero, flags zero; with alignment zero the address is
//     a host page multiple and never a granularity multiple (the default is
//     undocumented, so nothing may rely on more); no gaps between
//     reservations; cuMemCreate, cuMemMap: sizes,
//     addresses and the map offset multiples of the granularity, flags zero
//     (CUDA_ERROR_INVALID_VALUE);
//   - cuMemMap maps only inside one reservation, never over another mapping,
//     never beyond the handle's size (CUDA_ERROR_INVALID_VALUE);
//   - cuMemSetAccess covers whole mappings only (CUDA_ERROR_INVALID_VALUE);
//   - a stream made with CU_STREAM_NON_BLOCKING does not wait for the legacy
//     stream's work: cuMemcpyDtoHAsync_v2 on it reads the memory before the
//     memsets and copies still queued there, as a GPU may;
//   - memsets, device-to-device copies and the DMA of host-to-device copies
//     complete after the call, in order (see work): a device-to-host copy,
//     a synchronize, an event query or synchronize, CompleteEvents or Drain
//     runs them. A fault is the device's and is reported there: work touching
//     a mapping with no access, writing through a PROT_READ mapping, or
//     touching memory unmapped before it ran faults
//     (CUDA_ERROR_ILLEGAL_ADDRESS), and like on a GPU that error is sticky:
//     every later call in the process fails with it. Sim.Fault injects the
//     fault of a kernel the simulator does not run;
//   - a copy touching an address that is neither a live cuMemAlloc block nor
//     mapped fails at the call (CUDA_ERROR_INVALID_VALUE);
//   - cuMemUnmap removes exactly one whole mapping (CUDA_ERROR_INVALID_VALUE);
//   - cuMemRelease frees the physical memory only when the last mapping of
//     the handle is gone; cuMemAddressFree refuses a reservation that still
//     has mappings or does not match one exactly (CUDA_ERROR_INVALID_VALUE);
//   - device memory is bounded (CUDA_ERROR_OUT_OF_MEMORY), cuMemAlloc
//     charges whole pages and aligns blocks to 256 bytes, no more;
//   - a device without VMM reports attribute 102 as 0 and fails the VMM calls
//     (CUDA_ERROR_NOT_SUPPORTED);
//   - unknown streams and events are CUDA_ERROR_INVALID_HANDLE; cuEventCreate
//     takes only CUevent_flags bits; an event recorded in manual mode stays
//     CUDA_ERROR_NOT_READY until the test completes it (or its stream is
//     synchronized or destroyed).
//
// Every entry point but cuGetErrorName asks the contract's fault injector
// (Config.Faults, Sim.Inject: any memapi.Injector, with Layer "cudasim" and
// the entry point's C name) before it checks or changes anything, and
// returns the CUresult an injected error carries. Sim.FailCall makes any
// call fail once with any code, so OUT_OF_MEMORY at cuMemMap or
// cuMemSetAccess (which a driver may return when it cannot allocate page
// tables) is one call away.
//
// Fresh memory (cuMemAlloc, cuMemCreate) is filled with 0xA5, never zero:
// code that relies on fresh device memory being zero without clearing it
// fails here as it can on a GPU that recycles pages. Tests can inject a
// failure into any call (Config.Faults, Sim.FailCall) and inspect what is
// live (Sim.Stats).
package cudasim
