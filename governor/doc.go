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
from charged.

# Holders and pressure

Holders register with a priority and, per authority, an optional guarantee
(in the spirit of cgroup memory.min: those bytes are never asked for) and an
optional limit (memory.max: a reservation that would take the holder past it
fails with errOverLimit). When a reservation does not fit, the governor
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

# One lock, one record per reservation

Each authority has one mutex. It guards the authority's figures, its queue
of waiting reservations, the holders' accounts on it and the records of its
grants. Every Reserve makes a new record (one allocation), and no record is
ever reused: a Grant or a Lease names its own reservation for ever, so a
handle used after its grant ended (a double cancel, a refund of an emptied
lease, a Draw delayed past a Cancel) is refused with a typed error and never
reaches another holder's grant.

Bytes move between the figures in one place: one function per transition
(reserve, draw, undraw, commit, cancel, expire, mark pending, refund,
quarantine, refund quarantined), each of which books the same change on
the authority, on the holder's account and on the grant's record. So an
authority's figures are the sum of its accounts' and of its records' at
every instant the lock is free, and every figure anyone reads (a snapshot,
a pressure ticket, an over-budget error, a lease's figures) is exact.

# Observability

Governor.Snapshot returns a value with every figure per authority and per
holder, the tickets issued, the bytes each holder reported freeing and the
number of pressure events (each one is an EventPressure as it happens). A holder that implements
CacheReporter (a caching pool) has its charge shown split into cached bytes
and bytes in use; the snapshot asks it with no lock held and clamps the
figure to the charge. Options.OnEvent receives events as
they happen. Package promgov exports a snapshot as Prometheus metrics, so this
package has no dependency beyond the contract.

The governor starts no goroutine of its own; deadline timers are stopped by
Close.
*/
package governor
