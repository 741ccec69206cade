// Package cpu is the CPU memory mechanism of memgen: real Linux host memory
// behind all three capabilities of the contract, built from the kernel's own
// primitives through golang.org/x/sys/unix (no cgo).
//
//   - DeviceAllocator: each Allocation is its own private anonymous mmap,
//     page aligned, populated at once with MADV_POPULATE_WRITE (so an
//     out-of-memory is ErrOutOfMemory at Allocate, not a crash at first
//     touch) and returned with munmap. It is never Go heap memory.
//   - VirtualBacking: a Reservation is PROT_NONE, MAP_NORESERVE address space
//     aligned to the granularity (4 KiB or 2 MiB, default 2 MiB like CUDA;
//     with 2 MiB the range is advised MADV_HUGEPAGE). Commit is mprotect
//     read-write plus MADV_POPULATE_WRITE; Decommit is PROT_NONE plus
//     MADV_DONTNEED, which returns the pages to the kernel, so a range
//     committed again reads zeros. Committed bytes come from the mechanism's
//     own per-range state, which KernelBytes checks against mincore.
//   - SharedMapping: a Backing is a memfd whose pages fallocate allocated up
//     front (so it is charged at creation and its allocated blocks equal its
//     size). A View is mmap(MAP_SHARED|MAP_FIXED) of the memfd inside a
//     reservation, PROT_READ or PROT_READ|PROT_WRITE. Unmapping a view maps
//     PROT_NONE reserved space over it: nothing inside a reservation is ever
//     munmapped, so no other mapping can slip into a hole. CopyOnWrite copies
//     into a new memfd and remaps it read-write in place. ReleaseBacking
//     punches the memfd's pages out (MADV_DONTNEED does not free them) and
//     closes it.
//
// The mechanism never touches the ledger: it rejects a consuming call
// without a grant (ErrNoGrant) but draws nothing and refunds nothing; wrap it
// with generated/checked for that. Every failure is a *memapi.Error of one of
// the contract's kinds, with the errno as its cause, and leaves the state as
// it was. Options.Faults (a memapi.Injector) fails any of the kernel calls
// whose failure the mechanism handles, before it is made, to test exactly
// that.
//
// Context (NewContext) is the matching memapi.DeviceContext: ordered streams
// run by goroutines, fences that complete when the work before them has run,
// and copies that are memmoves between the mechanism's mappings, checked
// against its state first so that a copy into a read-only view fails with
// ErrReadOnly instead of faulting.
package cpu
