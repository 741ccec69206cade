/*
Package pool is a governed caching sub-allocator over a pmm Binding: arena
speed for small requests, its cached bytes charged in the governor's ledger
and given back when a pressure ticket asks (Reclaim).

Requests up to SmallMax (64 KiB) round to one of 28 size classes (256, 512,
768, 1024, then four per doubling) and come from slabs; a small Alloc or
Free locks one shard (the caller's P's) and no pool-wide lock when the shard
has a block. Larger requests are best-fit chunks of the arena rounded to
256 B, split on take and coalesced on free. The arena's backing is one stable
growable pmm Region where the mechanism offers VirtualBacking
(BackingRegion: its addresses reserved by New, growth commits at the end,
Reclaim decommits the free tail), else whole Buffers of the binding
(BackingSegments), each closed, through pmm's lifecycle, once it is wholly
free and a ticket or Trim asks. Either way the backing is charged to the
binding's holder.

The pool is levels, each a type that refills only from the one below it:
the shards (the fast path) from the depot of free small blocks, the depot
from the arena, the arena from the segments, and the segments from pmm.

A block freed behind fences that have not completed is pending: reusable at
once on its own stream, on others (and by Reclaim) only once its fences
complete; Close releases the segments behind them. See docs/pool.md.
*/
package pool
