package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/watchdog"
)

const noteEnv = "MEMCTL_TEST_NOTE" // the helper: join the ledger and note the moves its stdin names

// noteChild joins the ledger at path, says "joined", then notes a move per
// line of stdin ("KIND LEVEL BYTES HOST"), saying "noted" after each, and
// leaves at EOF.
func noteChild(path string) error {
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		return err
	}
	fmt.Println("joined")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var e xproc.TierEvent
		if _, err := fmt.Sscan(sc.Text(), &e.Kind, &e.Level, &e.Bytes, &e.Host); err != nil {
			return err
		}
		if err := l.Note(e); err != nil {
			return err
		}
		fmt.Println("noted")
	}
	return l.Close()
}

// noter is a running noteChild.
type noter struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startNoter(t *testing.T, path string) *noter {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), noteEnv+"="+path)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &noter{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	n.expect(t, "joined")
	return n
}

func (n *noter) expect(t *testing.T, want string) {
	t.Helper()
	line, err := n.out.ReadString('\n')
	if err != nil || line != want+"\n" {
		t.Fatalf("noter %d: %q %v, want %q", n.cmd.Process.Pid, line, err, want)
	}
}

// note has the child note a move and waits until it has.
func (n *noter) note(t *testing.T, kind string, level int, bytes, host uint64) {
	t.Helper()
	fmt.Fprintf(n.in, "%s %d %d %d\n", kind, level, bytes, host)
	n.expect(t, "noted")
}

// show prints each process's host tier, state, counts and last move, in
// binary units or in bytes.
func TestShowTiers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if code, _, e := memctl("create", path, "1GiB", "4"); code != 0 {
		t.Fatalf("create: %q", e)
	}
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, e := range []xproc.TierEvent{
		{Kind: "offload", Bytes: 8 << 20, Host: 8 << 20},
		{Kind: "restore", Bytes: 8 << 20},
		{Kind: "sleep", Level: 1, Bytes: 96 << 20, Host: 64 << 20},
	} {
		if err := l.Note(e); err != nil {
			t.Fatal(err)
		}
	}
	code, out, _ := memctl("show", path)
	t.Logf("memctl show:\n%s", out)
	pid := strconv.Itoa(os.Getpid())
	var row string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[1] == pid && strings.Contains(line, "asleep") {
			row = strings.Join(f, " ")
		}
	}
	if code != 0 || !strings.Contains(out, "host tier  ") || !strings.Contains(row, " 64MiB asleep at level 1 1 0 1 1 ") ||
		!strings.Contains(row, "sleep level 1: 96MiB off the device") {
		t.Fatalf("show: exit %d, the process's tier row %q:\n%s", code, row, out)
	}
	if _, out, _ := memctl("--bytes", "show", path); !strings.Contains(out, " 67108864 ") || !strings.Contains(out, "sleep level 1: 100663296 off the device") {
		t.Fatalf("show --bytes:\n%s", out)
	}
}

// watch prints a line per process present, then each join, sleep, wake,
// offload, restore and leave of another process as that process notes
// them, with the level, the bytes and the host tier; a process killed
// with -9 leaves, reclaimed; interrupted, watch exits 0.
func TestWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if code, _, e := memctl("create", path, "1GiB", "4"); code != 0 {
		t.Fatalf("create: %q", e)
	}
	// A member whose watcher reclaims the slot of a dead process.
	l, err := xproc.Open(path, xproc.Options{Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*watchdog.Bound)
	defer cancel()
	r, w := io.Pipe()
	exit := make(chan int, 1)
	var errb strings.Builder
	go func() {
		exit <- run(ctx, []string{"watch", path, "--interval", "10ms"}, w, &errb)
		w.Close()
	}()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen []string
	// next waits for the next line of watch, which must hold every part.
	next := func(parts ...string) {
		t.Helper()
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("watch ended (stderr %q) before a line with %q; it printed:\n%s", errb.String(), parts, strings.Join(seen, "\n"))
			}
			seen = append(seen, line)
			for _, p := range parts {
				if !strings.Contains(line, p) {
					t.Fatalf("watch printed %q, want %q in it; it printed:\n%s", line, parts, strings.Join(seen, "\n"))
				}
			}
		case <-time.After(watchdog.Bound):
			t.Fatalf("watchdog: no line with %q within %v; watch printed:\n%s", parts, watchdog.Bound, strings.Join(seen, "\n"))
		}
	}
	next("watching " + path + " every 10ms until interrupted; processes present: 1")
	next("pid "+strconv.Itoa(os.Getpid())+" ", "member: awake, host tier 0; 0 sleeps, 0 wakes, 0 offloads, 0 restores")
	n := startNoter(t, path)
	pid := "pid " + strconv.Itoa(n.cmd.Process.Pid) + " "
	next(pid, "join")
	n.note(t, "sleep", 1, 96<<20, 96<<20)
	next(pid, "sleep level 1: 96MiB off the device, host tier 96MiB")
	n.note(t, "wake", 1, 96<<20, 0)
	next(pid, "wake level 1: 96MiB back on the device, host tier 0")
	n.note(t, "offload", 0, 8<<20, 8<<20)
	next(pid, "offload: 8MiB of KV off the device, host tier 8MiB")
	n.note(t, "restore", 0, 8<<20, 0)
	next(pid, "restore: 8MiB of KV back on the device, host tier 0")
	n.note(t, "sleep", 2, 104<<20, 0)
	next(pid, "sleep level 2: 104MiB off the device, host tier 0")
	n.in.Close()
	if err := n.cmd.Wait(); err != nil {
		t.Fatalf("noter %d: %v", n.cmd.Process.Pid, err)
	}
	next(pid, "leave")
	if last := seen[len(seen)-1]; strings.Contains(last, "died") {
		t.Fatalf("a process that closed its ledger: %q", last)
	}
	// Killed with -9, a process leaves too: its slot is reclaimed by the
	// other member.
	k := startNoter(t, path)
	pid = "pid " + strconv.Itoa(k.cmd.Process.Pid) + " "
	next(pid, "join")
	k.note(t, "offload", 0, 4<<20, 4<<20)
	next(pid, "offload: 4MiB of KV off the device, host tier 4MiB")
	if err := k.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	next(pid, "leave (its process died: the ledger reclaimed its slot)")
	cancel()
	if code := <-exit; code != 0 {
		t.Fatalf("interrupted, watch exited %d (stderr %q)", code, errb.String())
	}
	t.Logf("memctl watch printed:\n%s", strings.Join(seen, "\n"))
}

// Between two reads: moves of several kinds and several of one kind come
// as a line per kind, counted, then the last one in full; a host tier
// noted alone; a slot taken by another process is a leave and a join.
func TestWatchChanges(t *testing.T) {
	at := time.Date(2026, 12, 8, 10, 30, 0, 0, time.Local)
	now := at.Add(time.Second)
	prev := []xproc.Slot{
		{Index: 0, PID: 10, Start: 1, Offloads: 1, Host: 4 << 20},
		{Index: 1, PID: 11, Start: 1, Sleeps: 1, Asleep: 1, Host: 64 << 20},
		{Index: 2, PID: 12, Start: 1},
		{Index: 3},
	}
	cur := []xproc.Slot{
		{Index: 0, PID: 10, Start: 1, Offloads: 4, Restores: 2, Host: 12 << 20, Last: xproc.TierEvent{Kind: "offload", Bytes: 8 << 20, Time: at}},
		{Index: 1, PID: 11, Start: 1, Sleeps: 1, Asleep: 1, Host: 60 << 20},
		{Index: 2, PID: 13, Start: 2},
		{Index: 3, PID: 14, Start: 1, Sleeps: 1, Asleep: 2, Last: xproc.TierEvent{Kind: "sleep", Level: 2, Bytes: 1 << 30, Time: at}},
	}
	got := changes(prev, cur, 1, now, human)
	want := []string{
		"10:30:01.000  pid 10  slot 0  offload x2, bytes not seen (noted before a later move, between two reads)",
		"10:30:01.000  pid 10  slot 0  restore x2, bytes not seen (noted before a later move, between two reads)",
		"10:30:00.000  pid 10  slot 0  offload: 8MiB of KV off the device, host tier 12MiB",
		"10:30:01.000  pid 11  slot 1  host tier 60MiB",
		"10:30:01.000  pid 12  slot 2  leave (its process died: the ledger reclaimed its slot)",
		"10:30:01.000  pid 13  slot 2  join",
		"10:30:01.000  pid 14  slot 3  join",
		"10:30:00.000  pid 14  slot 3  sleep level 2: 1GiB off the device, host tier 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("changes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := changes(cur, cur, 0, now, human); len(got) != 0 {
		t.Fatalf("no change: %q", got)
	}
	// Bad flags are usage errors.
	for _, args := range [][]string{{"watch", "x", "--interval"}, {"watch", "x", "--interval", "0s"}, {"watch", "x", "--every", "1s"}} {
		if code, _, _ := memctl(args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
	if code, _, e := memctl("watch", filepath.Join(t.TempDir(), "missing")); code != exitLedger || e == "" {
		t.Errorf("watch of a missing ledger: exit %d %q", code, e)
	}
}
