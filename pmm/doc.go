// Package pmm is the ProcessMemoryManager: the registry of devices, their
// mechanisms, device contexts and authorities, and the scoped MemoryBindings
// through which holders get memory. It is the layer a runtime integrator
// touches; it never exposes a raw allocator.
//
// A Binding (holder, role, device) resolves the device's mechanism on every
// call, so a capability query reflects the mechanism installed now, while
// every handle keeps the (checked) mechanism that created it and is released
// by it even after Replace (invariant no-stale-capability). Every flow is a
// transaction with rollback (invariant no-partial-state):
//
//   - Allocate: reserve a grant → allocate through the checked wrapper,
//     which draws from the grant → commit the grant into a lease → an owning
//     Buffer. Any failure returns the grant.
//   - ReserveVirtual + Region.Grow: grant → commit the range → the holder's
//     callback updates its view → commit the charge. On any failure the
//     range is decommitted, the grant returned, and the old view kept.
//   - Shared backings: created once and charged once, mapped read-only into
//     many regions, copied on write explicitly (the copy is charged), freed
//     and refunded when the last view and reference are gone.
//   - Region.Offload moves a region's committed ranges to another tier (a
//     Buffer of a binding on another authority: host memory) and
//     decommits them, keeping the addresses; Offloaded.Restore commits
//     them again and copies the bytes back. The destination is charged
//     before each copy and the source released only after it, so a
//     failure at any step leaves the bytes whole where they were.
//
// Releases go through the device context's deferred-free queue (package ep):
// the lease is marked pending-free at Close, the creating mechanism frees
// after every recorded fence completed, and the refund follows the free.
// Streams, copies and fences stay with the device context (invariant
// manager-not-ep); the manager chooses mechanisms and authorities only.
//
// Buffer, Region and Shared share ep's one lifecycle: a transaction holds
// its handle open and Close during it releases what it left; a free or a
// rollback that fails keeps its bytes charged as quarantined (visible in the
// governor's snapshots) until Retry or Close frees them; a holder callback
// that panics is rolled back, then the panic goes on. Manager.Close closes
// the bindings and reports what is still live. See docs/pmm.md.
package pmm
