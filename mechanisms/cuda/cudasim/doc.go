// Package cudasim is a CUDA driver written in Go: it fills a driver.Table
// with functions that keep device memory in host memory and enforce the rules
// the real driver documents, returning the real CUresult codes. The cuda
// mechanism runs unchanged on it, so its tests and the generated conformance
// suite run in CI on machines with no GPU.
//
// Rules enforced (each has a test that breaking it gives the code shown):
//
//   - nothing but cuInit and cuGetErrorName works before cuInit
//     (CUDA_ERROR_NOT_INITIALIZED); cuInit reports a stub library or no device
//     when configured so (CUDA_ERROR_STUB_LIBRARY, CUDA_ERROR_NO_DEVICE);
//   - the context is current per OS thread: memory, stream and event calls on
//     a thread with no current context fail (CUDA_ERROR_INVALID_CONTEXT), and
//     releasing the last reference to a primary context destroys everything
//     made in it;
//   - VMM sizes and addresses are multiples of the granularity, the mapping
//     offset is zero, flags are zero (CUDA_ERROR_INVALID_VALUE);
//   - cuMemMap maps only inside one reservation, never over another mapping,
//     never beyond the handle's size (CUDA_ERROR_INVALID_VALUE);
//   - cuMemSetAccess covers whole mappings only (CUDA_ERROR_INVALID_VALUE);
//   - memory is usable only after cuMemSetAccess: a copy touching a mapping
//     with no access, or writing through a PROT_READ mapping, faults
//     (CUDA_ERROR_ILLEGAL_ADDRESS), and like on a GPU that error is sticky:
//     every later call in the process fails with it;
//   - a copy touching an address that is neither a live cuMemAlloc block nor
//     mapped fails (CUDA_ERROR_INVALID_VALUE);
//   - cuMemUnmap removes exactly one whole mapping (CUDA_ERROR_INVALID_VALUE);
//   - cuMemRelease frees the physical memory only when the last mapping of
//     the handle is gone; cuMemAddressFree refuses a reservation that still
//     has mappings or does not match one exactly (CUDA_ERROR_INVALID_VALUE);
//   - device memory is bounded (CUDA_ERROR_OUT_OF_MEMORY), cuMemAlloc
//     charges whole pages;
//   - a device without VMM reports attribute 102 as 0 and fails the VMM calls
//     (CUDA_ERROR_NOT_SUPPORTED);
//   - unknown streams and events are CUDA_ERROR_INVALID_HANDLE; an event
//     recorded in manual mode stays CUDA_ERROR_NOT_READY until the test
//     completes it (or its stream is synchronized or destroyed).
//
// Fresh memory (cuMemAlloc, cuMemCreate) is filled with 0xA5, never zero:
// code that relies on fresh device memory being zero without clearing it
// fails here as it can on a GPU that recycles pages. Tests can inject a
// failure into any call (Sim.FailCall) and inspect what is live (Sim.Stats).
package cudasim
