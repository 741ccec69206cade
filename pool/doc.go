/*
Package pool is a governed caching sub-allocator over a pmm Binding: arena
speed for small requests, its cached bytes charged in the governor's ledger
and given back when a pressure ticket asks (Reclaim).

Requests up to SmallMax (1 MiB) round to one of 44 size classes (256, 512,
768, 1024, then four per doubling) and come from slabs; a small Alloc or
Free locks one of several shards and no pool-wide lock when the shard has a
block. Larger requests are best-fit chunks of the arena, split on take and
coalesced on free. The arena is made of segments, whole Buffers of the
binding (BackingSegments), each charged to the binding's holder and closed,
through pmm's lifecycle, once it is wholly free and a ticket or Trim asks.

A block freed behind fences that have not completed is pending: reusable at
once on its own stream, on others (and by Reclaim) only once its fences
complete; Close releases the segments behind them. See docs/pool.md.
*/
package pool
