// Package holders holds memgen's two reference holders, written to be
// adopted by a runtime as they are: a KV page store and a model residency
// store. Each gets its memory through pmm bindings (never a raw allocator),
// implements governor.Holder, and answers pressure tickets by freeing only
// what is safe to free, possibly nothing.
//
// # KV page store
//
// KVStore keeps one growable pmm.Region per request: the region reserves the
// request's maximum context once and grows in granularity chunks as decode
// steps append tokens (bytes per token from a ModelShape:
// 2 x layers x kv heads x head dim x dtype bytes), so the address never moves
// and memory is charged only as it is used. Requests that share a system
// prompt map one Prefix (a pmm.Shared backing, charged once) read-only at the
// start of their region, so no request writes into shared pages.
//
// Under a pressure ticket the store preempts requests: never one whose step
// is in flight (a fence recorded with Request.RecordUse has not completed),
// never the request whose own growth asked, and otherwise the lowest
// priority first, then idle before busy, then the one idle longest, then the
// newest. A ticket raised by an admission (Admit, Resume) preempts only
// lower priorities. A preempted request's region is closed (its memory freed
// behind its fences and refunded), the request is put on the requeue list
// and the OnPreempt callback is told: it is never silently dropped.
// KVStore.Resume admits it again, recomputing its tokens.
//
// # Model residency store
//
// Residency keeps weights as owning pmm.Buffers on a device binding, hot or
// cold by last use. Pinned weights, weights in use (a Use not yet Done, or
// recorded fences not yet complete) and weights used within HotFor are never
// evicted. Under a pressure ticket it offloads the coldest weights to host
// memory: a host-authority buffer from a second binding, filled by copies
// through the device contexts' streams, after which the device buffer is
// closed. Residency.Use reloads an offloaded weight on demand (allocate on
// the device, copy back, release the host copy). Offloads and reloads are
// counted.
//
// # Locks and the governor
//
// The governor calls Reclaim without its locks, in the goroutine of the
// reservation that needs memory, which may be a goroutine of the same store
// waiting inside Region.Grow or Binding.Allocate. Neither store holds its own
// lock across a pmm call: each marks the object it works on busy, releases
// its lock, calls pmm, and takes the lock again to record the result, so
// Reclaim never waits for a store call. The residency store skips busy
// weights. The KV store may choose a busy request: its call waits for the
// governor with a context the store cancels, and the call then closes the
// region and fails, the request Preempted, so two requests waiting for each
// other's memory never wait for ever.
//
// Neither store starts a goroutine.
package holders
