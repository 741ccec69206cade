package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/memgen/memgen/governor/xproc"
)

// defaultInterval is watch's period without --interval.
const defaultInterval = 100 * time.Millisecond

// watchVerb is memctl watch PATH [--interval D]: it reads the ledger every
// interval (each read waiting for the lock at most timeout) and prints a
// line per process present, then one per change it sees between two
// reads (a process joined or left, a sleep, wake, offload or restore it
// noted, its host tier's bytes), until ctx ends: exit 0. A read behind a
// lock held past timeout is reported on stderr and the next one tried; a
// ledger that cannot be read (missing, corrupt) ends it with exit 1.
func watchVerb(ctx context.Context, path string, flags []string, timeout time.Duration, stdout, stderr io.Writer, size func(uint64) string) int {
	interval := defaultInterval
	for len(flags) > 0 {
		v, ok := strings.CutPrefix(flags[0], "--interval=")
		switch {
		case ok:
			flags = flags[1:]
		case flags[0] == "--interval" && len(flags) > 1:
			v, flags = flags[1], flags[2:]
		default:
			fmt.Fprint(stderr, usage)
			return exitUsage
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(stderr, "memctl: interval %q is not a positive duration (e.g. 100ms, 1s)\n", v)
			return exitUsage
		}
		interval = d
	}
	read := func() (xproc.Header, []xproc.Slot, error) {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return xproc.InspectContext(rctx, path)
	}
	h, slots, err := read()
	if err != nil {
		if ctx.Err() != nil {
			return exitOK
		}
		fmt.Fprintln(stderr, "memctl:", err)
		return exitLedger
	}
	n := 0
	for _, s := range slots {
		if s.PID != 0 {
			n++
		}
	}
	fmt.Fprintf(stdout, "watching %s every %v until interrupted; processes present: %d\n", path, interval, n)
	now := time.Now()
	for _, s := range slots {
		if s.PID != 0 {
			fmt.Fprintln(stdout, eventLine(now, s, fmt.Sprintf("member: %s, host tier %s; %d sleeps, %d wakes, %d offloads, %d restores",
				state(s), size(s.Host), s.Sleeps, s.Wakes, s.Offloads, s.Restores)))
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return exitOK
		case <-t.C:
		}
		h2, cur, err := read()
		switch {
		case ctx.Err() != nil:
			return exitOK
		case errors.Is(err, context.DeadlineExceeded):
			fmt.Fprintln(stderr, "memctl:", err) // a lock holder stopped, say: the next read tries again
			continue
		case err != nil:
			fmt.Fprintln(stderr, "memctl:", err)
			return exitLedger
		}
		reclaimed := uint64(0)
		if h2.Reclaims > h.Reclaims {
			reclaimed = h2.Reclaims - h.Reclaims
		}
		for _, line := range changes(slots, cur, reclaimed, time.Now(), size) {
			fmt.Fprintln(stdout, line)
		}
		h, slots = h2, cur
	}
}

// changes is what happened between two reads of the ledger's slots, a
// line each, at now: a process that left (and, when the ledger reclaimed
// as many slots meanwhile, that it died), one that joined, and the moves
// each noted (moves).
func changes(prev, cur []xproc.Slot, reclaimed uint64, now time.Time, size func(uint64) string) []string {
	var lines []string
	var leaves []int // indices in lines
	for i := range max(len(prev), len(cur)) {
		var p, c xproc.Slot
		if i < len(prev) {
			p = prev[i]
		}
		if i < len(cur) {
			c = cur[i]
		}
		if p.PID != 0 && (p.PID != c.PID || p.Start != c.Start) {
			leaves = append(leaves, len(lines))
			lines = append(lines, eventLine(now, p, "leave"))
			p = xproc.Slot{}
		}
		if c.PID == 0 {
			continue
		}
		if p.PID == 0 {
			lines = append(lines, eventLine(now, c, "join"))
		}
		lines = append(lines, moves(p, c, now, size)...)
	}
	if len(leaves) > 0 && reclaimed >= uint64(len(leaves)) {
		for _, i := range leaves {
			lines[i] += " (its process died: the ledger reclaimed its slot)"
		}
	}
	return lines
}

// moves is what one process noted between two reads of its slot, p then
// c: a line per sleep, wake, offload or restore it counted, the last one
// with its level, its bytes and the host tier's after it (the slot keeps
// the last move's alone: the moves noted before it in the same interval
// are a line per kind, counted), or the host tier's bytes when it noted
// them alone.
func moves(p, c xproc.Slot, now time.Time, size func(uint64) string) []string {
	var lines []string
	last := false
	for _, k := range []struct {
		kind      string
		was, seen uint64
	}{{"sleep", p.Sleeps, c.Sleeps}, {"wake", p.Wakes, c.Wakes}, {"offload", p.Offloads, c.Offloads}, {"restore", p.Restores, c.Restores}} {
		if k.seen <= k.was {
			continue
		}
		n := k.seen - k.was
		if k.kind == c.Last.Kind {
			last, n = true, n-1
		}
		if n > 0 {
			lines = append(lines, eventLine(now, c, fmt.Sprintf("%s x%d, bytes not seen (noted before a later move, between two reads)", k.kind, n)))
		}
	}
	if last {
		lines = append(lines, eventLine(c.Last.Time, c, describe(c.Last, size)+", host tier "+size(c.Host)))
	} else if c.Host != p.Host {
		lines = append(lines, eventLine(now, c, "host tier "+size(c.Host)))
	}
	return lines
}

// describe is a move as watch and show print it (without the host tier's
// bytes after it: the slot's now).
func describe(e xproc.TierEvent, size func(uint64) string) string {
	switch e.Kind {
	case "sleep":
		return fmt.Sprintf("sleep level %d: %s off the device", e.Level, size(e.Bytes))
	case "wake":
		return fmt.Sprintf("wake level %d: %s back on the device", e.Level, size(e.Bytes))
	case "offload":
		return fmt.Sprintf("offload: %s of KV off the device", size(e.Bytes))
	case "restore":
		return fmt.Sprintf("restore: %s of KV back on the device", size(e.Bytes))
	}
	return "none"
}

// eventLine is one line of watch: the time, the process, what happened.
func eventLine(at time.Time, s xproc.Slot, what string) string {
	return fmt.Sprintf("%s  pid %d  slot %d  %s", at.Format("15:04:05.000"), s.PID, s.Index, what)
}

// state is a process's sleep state.
func state(s xproc.Slot) string {
	if s.Asleep == 0 {
		return "awake"
	}
	return fmt.Sprintf("asleep at level %d", s.Asleep)
}
