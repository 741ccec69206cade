package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memgen/memgen/governor/xproc"
)

const usage = `usage:
  memctl [--timeout DURATION] show PATH
  memctl [--timeout DURATION] set-capacity PATH BYTES [REVISION]
  memctl [--timeout DURATION] create PATH BYTES [SLOTS [GID]]
`

// run is the command with its arguments and outputs: its exit code.
func run(args []string, stdout, stderr io.Writer) int {
	timeout := xproc.DefaultLockTimeout
	if len(args) > 0 && (args[0] == "--timeout" || strings.HasPrefix(args[0], "--timeout=")) {
		v, rest := strings.TrimPrefix(args[0], "--timeout="), args[1:]
		if args[0] == "--timeout" {
			if len(rest) == 0 {
				fmt.Fprint(stderr, usage)
				return 2
			}
			v, rest = rest[0], rest[1:]
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(stderr, "memctl: timeout %q is not a positive duration (e.g. 2s, 500ms)\n", v)
			return 2
		}
		timeout, args = d, rest
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	path := args[1]
	switch {
	case args[0] == "show" && len(args) == 2:
		h, slots, err := xproc.InspectContext(ctx, path)
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return 1
		}
		show(stdout, path, h, slots)
		return 0
	case args[0] == "set-capacity" && (len(args) == 3 || len(args) == 4):
		capacity, err := parseBytes(args[2])
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return 2
		}
		var rev uint64
		if len(args) == 4 {
			if rev, err = strconv.ParseUint(args[3], 10, 64); err != nil || rev == 0 {
				fmt.Fprintf(stderr, "memctl: revision %q is not a positive integer\n", args[3])
				return 2
			}
		}
		ch, err := xproc.SetCapacityContext(ctx, path, capacity, rev)
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: revision %d, capacity %d, claimed %d", ch.Outcome, ch.Revision, ch.Capacity, ch.Claimed)
		switch ch.Outcome {
		case xproc.Deferred:
			fmt.Fprintf(stdout, ", %d bytes to give back", ch.Excess)
		case xproc.Refused:
			fmt.Fprintf(stdout, ": %s", ch.Reason)
		}
		fmt.Fprintln(stdout)
		return 0
	case args[0] == "create" && len(args) >= 3 && len(args) <= 5:
		capacity, err := parseBytes(args[2])
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return 2
		}
		c := xproc.CreateOptions{Capacity: capacity}
		if len(args) >= 4 {
			if c.Slots, err = strconv.Atoi(args[3]); err != nil {
				fmt.Fprintf(stderr, "memctl: slots %q is not an integer\n", args[3])
				return 2
			}
		}
		if len(args) == 5 {
			if c.Group, err = strconv.Atoi(args[4]); err != nil {
				fmt.Fprintf(stderr, "memctl: gid %q is not an integer\n", args[4])
				return 2
			}
			c.Mode = 0o660
		}
		if _, err := os.Stat(path); err == nil {
			fmt.Fprintf(stderr, "memctl: %s exists\n", path)
			return 1
		}
		l, err := xproc.OpenContext(ctx, path, xproc.Options{Create: &c})
		if err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return 1
		}
		if err := l.CloseContext(ctx); err != nil {
			fmt.Fprintln(stderr, "memctl:", err)
			return 1
		}
		fmt.Fprintf(stdout, "created %s: capacity %d\n", path, capacity)
		return 0
	}
	fmt.Fprint(stderr, usage)
	return 2
}

func show(w io.Writer, path string, h xproc.Header, slots []xproc.Slot) {
	free := uint64(0)
	if h.Capacity > h.Claimed {
		free = h.Capacity - h.Claimed
	}
	fmt.Fprintf(w, "%s: version %d, revision %d, %d slots\n", path, h.Version, h.Revision, h.Slots)
	fmt.Fprintf(w, "capacity %d  claimed %d  unclaimed %d  reserved %d  charged %d  pending %d  private %d\n",
		h.Capacity, h.Claimed, free, h.Reserved, h.Charged, h.Pending, h.Private)
	fmt.Fprintf(w, "reclaimed slots %d  repairs %d  wanted %d\n", h.Reclaims, h.Repairs, h.Want)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "slot\tpid\tclaim\treserved\tcharged\tpending\tprivate\twant\tsettles\t")
	for _, s := range slots {
		if s.PID == 0 {
			continue
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", s.Index, s.PID, s.Claim, s.Reserved, s.Charged, s.Pending, s.Private, s.Want, s.Seq)
	}
	tw.Flush()
}

// parseBytes reads a byte count with an optional K, M, G or T suffix.
func parseBytes(s string) (uint64, error) {
	mult := uint64(1)
	if i := strings.IndexAny(s, "KMGTkmgt"); i == len(s)-1 && i > 0 {
		mult = 1 << (10 * (strings.IndexByte("KMGT", strings.ToUpper(s[i:])[0]) + 1))
		s = s[:i]
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 || v > (1<<52)/mult {
		return 0, fmt.Errorf("%q is not a byte count (a positive integer, K, M, G or T suffix)", s)
	}
	return v * mult, nil
}
