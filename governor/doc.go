/*
Package governor is memgen's ledger: it keeps, per authority (one physical
pool in one accounting scope, such as "cuda:0" or "host"), the accounts of
device memory and asks holders for memory when it runs short. It never frees
a holder's data itself: the governor asks, holders choose.

# The ledger

Every authority has a capacity and four figures that always add up to it:

	reserved + charged + pending + free = capacity

where:

  - reserved: provisional grants not yet committed (drawn or not), plus the
    drawn bytes of grants reclaimed after their deadline (see Grants);
  - charged: committed bytes owned by a holder through a lease;
  - pending: bytes a holder has released whose real free waits for device
    fences (Lease.MarkPending);
  - free: the rest.

No figure is ever negative and the sum never exceeds the capacity: a
reservation that does not fit waits or fails, it is never overcommitted.

# Grants

Governor.Reserve returns a Grant: a provisional budget of the requested
bytes. Physical commits draw from it (it implements memapi.Grant, which the
generated checked wrappers draw from); Grant.Commit turns the drawn bytes
into the holder's Lease and returns the undrawn rest to free; Grant.Cancel
returns everything, but only once nothing is drawn: a cancel that would
forget installed backing fails with memapi.ErrInUse, because the ledger must
never lose installed bytes. A grant also implements memapi.Account: refunding
to it un-draws, which is how a rollback that decommits gives bytes back.

A grant whose deadline passes is reclaimed: its undrawn bytes return to free
at once and Draw or Commit fail with memapi.ErrGrantClosed. Its drawn bytes
are backing that is still installed, so they stay reserved (and are shown as
ExpiredDrawn in the snapshot) until the holder rolls the backing back and
undraws or refunds them to the grant, which moves them to free.

# Leases

A Lease holds a holder's charged bytes. Lease.MarkPending moves bytes to
pending while their memory waits for fences; Lease.Refund (the memapi.Account
method) returns bytes whose memory was really freed, from pending first, then
from charged. Lease.Release refunds everything left.

# Holders and pressure

Holders register with a priority and, per authority, an optional guarantee
(in the spirit of cgroup memory.min: those bytes are never asked for) and an
optional limit (memory.max: a reservation that would take the holder past it
fails with ErrOverLimit). When a reservation does not fit, the governor
computes the shortfall (all waiting bytes less free, pending and bytes already
asked for), issues pressure Tickets to the holders that can give memory —
lower priority first, then the largest amount over the guarantee — and calls
their Reclaim in the reserving goroutine without holding any lock, so a
holder may refund leases, mark them pending or use the governor from inside
Reclaim. A holder may free 0. The reservation then waits, bounded by its
context (and the request's deadline, if any), for refunds. Waiters are served strictly in arrival
order: a later small request never overtakes an earlier large one. A wait that
ends by context or deadline fails with an *OverBudgetError carrying the
figures, and leaves no trace in the ledger.

# The hot path

There is one way to reserve: Governor.Reserve(ctx, Request). A grant whose
use ended (cancelled, or committed and its lease emptied by a refund) is
kept by the governor and issued again by a later Reserve, so a steady
stream of reservations allocates nothing: the grant refunded last waits in
the authority's slot for the next reservation of its size, and when several
goroutines reserve on the authority at once, refunded grants wait per P in
a pool instead, so they share nothing. A Grant and a Lease are handles
that carry the issue they were made for: once the record was issued again,
every method of an old handle fails with ErrStaleHandle and changes
nothing, so a double cancel or refund never reaches the next holder. The
cycle reserve, draw, commit, refund keeps every account:

  - Draw and Undraw are one compare-and-swap on the grant's word.
  - Commit of a fully drawn grant is one compare-and-swap: no byte returns
    to free, so nothing can be served by it.
  - Refund of all of such a lease, untouched since, is one compare-and-swap.
  - Reserve of the same reservation again, right after that refund, takes
    that grant back in one compare-and-swap: the bytes never left.

What those swaps leave unbooked, the authority settles under its lock before
anything reads it: a snapshot, a pressure ticket, an over-budget error, a
lease's figures, Unregister, RemoveAuthority, SetCapacity, and a reservation
that does not fit (it settles before it waits or fails, so bytes refunded
without the lock are never missing). A refund without the lock while a
reservation waits takes the lock and serves it. So every figure anyone reads
is exact and the identity holds; in between, the authority's raw figures only
lag on the safe side (bytes refunded but not yet settled still count as
reserved).

# Observability

Governor.Snapshot returns a value with every figure per authority and per
holder, the tickets issued, the bytes each holder reported freeing and the
recent pressure events with their time. A holder that implements
CacheReporter (a caching pool) has its charge shown split into cached bytes
and bytes in use; the snapshot asks it with no lock held and clamps the
figure to the charge. Options.OnEvent receives events as
they happen. Package promgov exports a snapshot as Prometheus metrics, so this
package has no dependency beyond the contract.

The governor starts no goroutine of its own; deadline timers are stopped by
Close.
*/
package governor
