// Package ep orders releases behind device work: the part of an execution
// provider that the memory layer relies on.
//
// A Context wraps a device context (memapi.DeviceContext) with a deferred-free
// Queue and a count of the allocations alive in it. An Owned handle records
// the fences of device work that used its memory (RecordUse); Close enqueues
// the release and returns at once, never blocking on the device. The queue
// frees the memory through the mechanism that created it only after every
// recorded fence completed, and the refund reaches the ledger only after that
// free (invariant fence-ordered-release). Closing a Context while allocations
// made in it are alive fails with memapi.ErrInUse, or waits if asked; it never
// frees underneath them (invariant context-pinned).
//
// Waiting is completion-driven: fences that offer a Ready channel wake the
// queue when they complete; fences that can only be polled are polled in
// batches with exponential backoff while any release waits on one.
//
// Every owning handle follows one Lifecycle: Open → Closing → Pending →
// Released, or Quarantined when its free failed (the memory still held and
// charged, the context pinned, Retry or Close trying again). Transactions
// hold a handle open between Begin and End; Close during one schedules the
// release when it ends. Releases that depend on each other are ordered by
// the queue (a Completion is a fence on another release), so no release
// waits for another inside the queue's goroutine. A panicking hook still
// leaves the release scheduled; a panicking free is recovered on the queue
// and quarantines its handle. Memory no handle owns any more (a rollback
// that failed) is kept by a lifecycle born Quarantined (OwnQuarantined):
// it pins the context, or, when the context is closing and refuses the
// pin, pins nothing and is freed by RetryQuarantined in the caller's
// goroutine, since it waits for no fence.
//
// A handle dropped without Close is reported as a leak (log/slog and a
// counter) and still released through the queue; runtime.AddCleanup is that
// backstop, never the normal path. It watches the Owned, never the
// Lifecycle it releases, so it runs for every kind of handle.
package ep
