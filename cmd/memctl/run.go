package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/bytesize"
	"github.com/memgen/memgen/internal/clihelp"
)

const usage = `usage:
  memctl [--timeout DURATION] [--bytes] show PATH
  memctl [--timeout DURATION] [--bytes] watch PATH [--interval DURATION]
  memctl [--timeout DURATION] [--bytes] set-capacity PATH BYTES [REVISION]
  memctl [--timeout DURATION] [--bytes] create PATH BYTES [SLOTS [GID]]
  memctl [VERB] --help
`

// verbHelp is each verb's --help: its usage, what it does, an example.
var verbHelp = map[string]string{
	"show": `usage: memctl [--timeout DURATION] [--bytes] show PATH

Prints the ledger's format version, the limits' revision (what set-capacity
takes as REVISION), the capacity and the totals, then every taken slot: the
process, its claim, its reserved, charged, pending and private bytes, its
want and its settles; and below, each process's host tier as it noted it:
the bytes it holds there, whether it is awake or asleep (at level 1: its
weights on the host tier; 2: discarded), its sleeps, wakes, offloads and
restores counted, and the last of them. Sizes are in binary units (64MiB,
1.5GiB); --bytes prints plain byte counts.

example:
  memctl show /dev/shm/memgen-gpu0
`,
	"watch": `usage: memctl [--timeout DURATION] [--bytes] watch PATH [--interval DURATION]

Reads the ledger every --interval (default 100ms) until interrupted (Ctrl-C,
SIGTERM: exit 0) and prints a line per process present, then a line per
change it sees: a process that joins or leaves (and whether it died and its
slot was reclaimed), and each sleep, wake, offload and restore a process
notes, with its level, the bytes it moved and the host tier's bytes after
it. A slot keeps the last move's bytes alone: moves noted before another
one between two reads are counted ("offload x2, bytes not seen"). A read
that waits past --timeout for the lock is reported and the next one tried.

example:
  memctl watch /dev/shm/memgen-gpu0 --interval 1s
`,
	"set-capacity": `usage: memctl [--timeout DURATION] [--bytes] set-capacity PATH BYTES [REVISION]

Changes the shared capacity while the processes run. REVISION, when given,
is the revision you last read (show prints it): on a stale view the change
is refused, and the answer names the current revision and the command to
retry with. The answer is applied, deferred (the claims exceed the new
capacity: it holds for new claims at once, and fully once the processes
give back the excess) or refused, and why (exit code 3: nothing changed).

example:
  memctl set-capacity /dev/shm/memgen-gpu0 60GiB 7
`,
	"create": `usage: memctl [--timeout DURATION] [--bytes] create PATH BYTES [SLOTS [GID]]

Makes a ledger with BYTES of capacity and SLOTS process slots (64 when
left out), mode 0600, or with GID mode 0660 and that group. A file already
at PATH is an error.

example:
  memctl create /dev/shm/memgen-gpu0 80GiB 64 1001
`,
}

const help = `memctl shows and changes the ledger file that several processes share to
hold one memory budget (package governor/xproc).

` + usage + `
PATH is the ledger file: the path the processes give to xproc.Open, usually a
file under /dev/shm (a tmpfs, such as /dev/shm/memgen-gpu0), or any path on a
local file system. memctl create makes it; the processes open it.

  show          the capacity, the limits' revision, the totals and every taken
                slot (pid, claim, reserved, charged, pending), and each
                process's host tier (bytes, asleep or awake, its sleeps,
                wakes, offloads and restores)
  watch         print each join, leave, sleep, wake, offload and restore as
                the processes note them, until interrupted
  set-capacity  change the shared capacity while the processes run. REVISION,
                when given, is the revision you last read (show prints it): on
                a stale view the change is refused. The answer says applied,
                deferred (the claims exceed the new capacity: it holds for new
                claims at once and fully once the processes give back the
                excess) or refused, and why.
  create        make a ledger with BYTES of capacity and SLOTS process slots;
                mode 0600, or with GID 0660 and that group

--timeout DURATION (default 5s) bounds the wait for the ledger's lock (each
read's, for watch): behind a process that holds it and is stopped (SIGSTOP, a
freezer, a debugger), memctl fails at the timeout with exit code 1, naming
that process and its state (watch says so and reads again).

BYTES is a byte count: plain bytes (4096) or with a binary unit, K/KiB, M/MiB,
G/GiB, T/TiB, any case (64K, 512MiB, 1GiB, 1.5GiB).

Sizes are printed in binary units (64MiB, 1.5GiB); --bytes prints plain byte
counts. memctl VERB --help describes a verb, with an example.

` + clihelp.ExitCodes + `memctl: 0 is set-capacity applied or deferred, or watch interrupted; 1 a
ledger error (a missing, corrupt, truncated or foreign-version file, reported
with its kind, or the lock's timeout); 2 a bad DURATION too;
3 set-capacity refused the change (a stale REVISION, or a capacity the
ledger cannot take).
`

// The exit codes, shared with memgen and memdemo (clihelp.ExitCodes).
const (
	exitOK     = clihelp.ExitOK
	exitLedger = clihelp.ExitFailed
	exitUsage  = clihelp.ExitUsage
	// exitRefused is set-capacity's exit code when the ledger refused the
	// change: a script can tell it from one that was applied.
	exitRefused = clihelp.ExitRefused
)

// run is the command with its arguments and outputs: its exit code. ctx
// ends it early (SIGINT, SIGTERM): watch runs until it ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			for _, v := range args {
				if h, ok := verbHelp[v]; ok {
					fmt.Fprint(stdout, h)
					return exitOK
				}
			}
			fmt.Fprint(stdout, help)
			return exitOK
		}
	}
	size := human
	for i, a := range args {
		if a == "--bytes" {
			size = func(n uint64) string { return strconv.FormatUint(n, 10) }
			args = slices.Delete(slices.Clone(args), i, i+1)
			break
		}
	}
	if len(args) == 1 && args[0] == "help" {
		fmt.Fprint(stdout, help)
		return exitOK
	}
	timeout := xproc.DefaultLockTimeout
	if len(args) > 0 && (args[0] == "--timeout" || strings.HasPrefix(args[0], "--timeout=")) {
		v, rest := strings.TrimPrefix(args[0], "--timeout="), args[1:]
		if args[0] == "--timeout" {
			if len(rest) == 0 {
				fmt.Fprint(stderr, usage)
				return exitUsage
			}
			v, rest = rest[0], rest[1:]
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(stderr, "memctl: timeout %q is not a positive duration (e.g. 2s, 500ms)\n", v)
			return exitUsage
		}
		timeout, args = d, rest
	}
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	path := args[1]
	if args[0] == "watch" {
		return watchVerb(ctx, path, args[2:], timeout, stdout, stderr, size)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case args[0] == "show" && len(args) == 2:
		h, slots, err := xproc.InspectContext(ctx, path)
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return exitLedger
		}
		show(stdout, path, h, slots, size)
		return exitOK
	case args[0] == "set-capacity" && (len(args) == 3 || len(args) == 4):
		capacity, err := parseBytes(args[2])
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return exitUsage
		}
		var rev uint64
		if len(args) == 4 {
			if rev, err = strconv.ParseUint(args[3], 10, 64); err != nil || rev == 0 {
				fmt.Fprintf(stderr, "memctl: revision %q is not a revision: revisions start at 1 (memctl show %s prints the current one)\n", args[3], path)
				return exitUsage
			}
		}
		ch, err := xproc.SetCapacity(ctx, path, capacity, rev)
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return exitLedger
		}
		fmt.Fprintf(stdout, "%s: revision %d, capacity %s, claimed %s", ch.Outcome, ch.Revision, size(ch.Capacity), size(ch.Claimed))
		switch ch.Outcome {
		case xproc.Deferred:
			fmt.Fprintf(stdout, ", %s to give back", size(ch.Excess))
		case xproc.Refused:
			fmt.Fprintf(stdout, ": %s\n", ch.Reason)
			if rev != 0 && rev != ch.Revision {
				fmt.Fprintf(stdout, "the ledger is at revision %d: check it (memctl show %s), then retry with\n  memctl set-capacity %s %s %d\n",
					ch.Revision, path, path, args[2], ch.Revision)
			}
			return exitRefused
		}
		fmt.Fprintln(stdout)
		return exitOK
	case args[0] == "create" && len(args) >= 3 && len(args) <= 5:
		capacity, err := parseBytes(args[2])
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return exitUsage
		}
		c := xproc.CreateOptions{Capacity: capacity}
		if len(args) >= 4 {
			if c.Slots, err = strconv.Atoi(args[3]); err != nil {
				fmt.Fprintf(stderr, "memctl: slots %q is not an integer\n", args[3])
				return exitUsage
			}
		}
		if len(args) == 5 {
			if c.Group, err = strconv.Atoi(args[4]); err != nil {
				fmt.Fprintf(stderr, "memctl: gid %q is not an integer\n", args[4])
				return exitUsage
			}
			c.Mode = 0o660
		}
		if _, err := os.Stat(path); err == nil {
			fmt.Fprintf(stderr, "memctl: %s exists\n", path)
			return exitLedger
		}
		l, err := xproc.OpenContext(ctx, path, xproc.Options{Create: &c})
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return exitLedger
		}
		if err := l.CloseContext(ctx); err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return exitLedger
		}
		fmt.Fprintf(stdout, "created %s: capacity %s\n", path, size(capacity))
		return exitOK
	}
	fmt.Fprint(stderr, usage)
	return exitUsage
}

func show(w io.Writer, path string, h xproc.Header, slots []xproc.Slot, size func(uint64) string) {
	free := uint64(0)
	if h.Capacity > h.Claimed {
		free = h.Capacity - h.Claimed
	}
	fmt.Fprintf(w, "%s: version %d, revision %d, %d slots\n", path, h.Version, h.Revision, h.Slots)
	fmt.Fprintf(w, "capacity %s  claimed %s  unclaimed %s\n", size(h.Capacity), size(h.Claimed), size(free))
	fmt.Fprintf(w, "reserved %s  charged %s  pending %s  private %s  wanted %s\n",
		size(h.Reserved), size(h.Charged), size(h.Pending), size(h.Private), size(h.Want))
	fmt.Fprintf(w, "reclaimed slots %d  repairs %d\n", h.Reclaims, h.Repairs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "slot\tpid\tclaim\treserved\tcharged\tpending\tprivate\twant\tsettles\t")
	for _, s := range slots {
		if s.PID == 0 {
			continue
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", s.Index, s.PID, size(s.Claim), size(s.Reserved),
			size(s.Charged), size(s.Pending), size(s.Private), size(s.Want), s.Seq)
	}
	tw.Flush()
	// The host tier of each process, as it noted it (xproc.Ledger.Note).
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "slot\tpid\thost tier\tstate\tsleeps\twakes\toffloads\trestores\t  last move")
	for _, s := range slots {
		if s.PID == 0 {
			continue
		}
		last := "none"
		if s.Last.Kind != "" {
			last = fmt.Sprintf("%s %s", s.Last.Time.Format("15:04:05"), describe(s.Last, size))
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t  %s\n", s.Index, s.PID, size(s.Host), state(s), s.Sleeps, s.Wakes, s.Offloads, s.Restores, last)
	}
	tw.Flush()
}

// human is n in the largest binary unit it reaches, to two decimals at
// most (64MiB, 1.5GiB, 1.01GiB), plain bytes below 1KiB (512B): the
// --bytes form is exact.
func human(n uint64) string {
	if n < 1<<10 {
		return bytesize.Format(n)
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + unit
}

// parseBytes reads a positive byte count (internal/bytesize's syntax, the
// one memdemo takes too) that a ledger can hold (at most 2^52 bytes).
func parseBytes(s string) (uint64, error) {
	v, err := bytesize.Parse(s)
	if err != nil {
		return 0, err
	}
	if v == 0 || v > 1<<52 {
		return 0, fmt.Errorf("size %q: want a positive byte count of at most 4PiB", s)
	}
	return v, nil
}
