// Package xproc shares one governor authority among the processes of a
// host: every process that opens the same ledger file claims its bytes
// from it, so that together they never admit more than the device holds.
//
// # The ledger file
//
// The file (typically under /dev/shm, mode 0600, or 0660 with a group) is a
// header of 64-bit words (magic, version, slot count, the shared capacity,
// the totals claimed, reserved, charged, pending and private, the dirty
// mark, counters, the operator's want and a CRC-64 checksum) and one slot
// per process: its PID and start time, its claim and its settled figures,
// and its want (format.go). Every process maps it MAP_SHARED and reads and
// writes each word with one aligned atomic operation. Open creates it when
// absent (written whole under a temporary name, then linked into place),
// refuses a file that is not what it creates (a symbolic link, not a
// regular file, a mode beyond 0660, a stranger's file) and one that does
// not parse (truncated, foreign, of another version, corrupt), then takes
// a free slot. Reading a file checks it and never panics.
//
// # The lock
//
// Every change is made under flock(LOCK_EX) on the file (readers such as
// Inspect take LOCK_SH). The kernel drops a flock when its holder dies,
// however it dies. flock itself waits without a bound, so the lock is
// taken with LOCK_NB and tried again with a backoff until the caller's
// context ends (the forms without a context wait Options.LockTimeout or
// DefaultLockTimeout); a wait that ends is an error naming the
// processes that hold the lock and their state from /proc/locks and
// /proc/PID/stat, so a lock holder that is stopped (SIGSTOP, a freezer, a
// debugger) delays the others only up to their bounds and is named. While
// a process holds the lock the header carries its dirty mark; letting go
// writes the checksum, then clears it. A lock holder that finds the header
// dirty knows the last holder died inside the lock and recomputes the
// totals from the slots.
//
// # Claims
//
// Bind makes the ledger the governor.Admission of the process's local
// authority, whose capacity is the slot's claim. A reservation that fits
// the local free bytes never touches the file. One that does not claims
// its shortfall from the ledger under the lock, so the sum of the claims
// never exceeds the shared capacity and no process installs bytes another
// process's grant covers; a claim that does not fit first reclaims the
// slots of dead processes, then fails with a *governor.OverBudgetError
// before any mechanism is called. A settler goroutine publishes the local
// figures into the slot every Options.Poll and gives back the claim the
// process does not use; a reservation that may wait posts a want that the
// other processes split among themselves and answer by asking their own
// holders to free bytes.
//
// # Dead and stopped processes
//
// A slot records its owner's PID and start time (field 22 of
// /proc/PID/stat): a PID that now names a process with another start time
// is a successor, and a zombie counts as dead, having released its memory.
// A watcher goroutine holds a pidfd on the owner of every other slot and
// polls them: a pidfd turns readable when its process exits, so a death
// wakes it at once, and each wake, and at least every Poll, it reclaims the
// slots of dead owners under the lock. Reclaiming a slot takes its claim
// and figures out of the totals and withdraws its want: the kernel freed
// the dead process's memory (its mappings, its CUDA context), so its bytes
// are free on the device, and every grant it held is gone with it. Each
// reclaim is counted in the header (Header.Reclaims). A stopped process
// is alive: its slot and claim stay; only while it holds the lock does it
// delay the others, each up to its own bound, as above. Killed instead,
// its lock is dropped by the kernel, the next holder repairs what it left
// half-written, and its slot is reclaimed.
//
// See docs/multiprocess.md for the design in full, the measured
// reclaim latencies after kill -9, and memctl, the command that creates,
// shows and resizes a ledger.
package xproc
