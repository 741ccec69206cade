// Command memctl shows and changes a ledger file that several processes
// share (package governor/xproc).
//
//	memctl show PATH                      the capacity, the limits' revision,
//	                                      the totals and every taken slot,
//	                                      and each process's host tier
//	memctl watch PATH [--interval D]      a line per join, leave, sleep,
//	                                      wake, offload and restore, until
//	                                      interrupted
//	memctl set-capacity PATH BYTES [REV]  change the shared capacity while the
//	                                      processes run; REV, when given, is
//	                                      the revision last read: a change on
//	                                      a stale view is refused
//	memctl create PATH BYTES [SLOTS [GID]] make a ledger (mode 0600; with GID,
//	                                      0660 and that group)
//
// PATH is the ledger file the processes share (the path they give to
// xproc.Open, usually under /dev/shm). BYTES is plain bytes or a number
// with a binary unit: 4096, 64K, 512MiB, 1GiB. set-capacity prints whether
// the change was applied, deferred (the claims exceed it: it holds for new
// claims at once and fully once the processes give back the excess) or
// refused, and why. memctl --help says all this.
//
// A process's host tier is what it noted in its slot (xproc.Ledger.Note):
// the bytes it moved off the device and holds on the host, whether it is
// asleep (level 1: its weights on the host tier; 2: discarded), and its
// sleeps, wakes, offloads and restores, counted, with the last one's level,
// bytes and time. watch reads the ledger every --interval (default 100ms)
// and prints the changes it sees; moves noted between two reads before a
// later one are counted without their bytes (the slot keeps the last
// move's alone).
//
// --timeout (default 5s) bounds the wait for the ledger's lock: a process
// that holds it and is stopped (SIGSTOP, a freezer, a debugger) makes
// memctl fail at the timeout with exit code 1, naming that process and its
// state.
//
// Exit codes, the same in memgen and memdemo: 0 done (set-capacity applied
// or deferred, watch interrupted), 1 a ledger error (a missing, corrupt,
// truncated or foreign-version file is reported with its kind; a lock wait
// that timed out), 2 a usage error, 3 set-capacity refused the change (nothing
// changed).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
