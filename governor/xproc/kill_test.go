package xproc

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"

	"github.com/memgen/memgen/governor"
)

// childChurn: join and churn forever (reserve, allocate, commit, free, hold
// open grants with bytes drawn, settle) until killed; "ready" once it
// holds a lease and an open grant.
func childChurn() error {
	c, err := joinCPU()
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed(), 2))
	var hold []held
	ready := false
	for {
		switch k := rng.IntN(8); {
		case k < 3 || len(hold) == 0:
			h, err := c.take(memapi.Bytes(rng.IntN(16)+1) * 4 << 10)
			if err == nil {
				hold = append(hold, h)
			}
		case k < 5:
			i := rng.IntN(len(hold))
			if err := c.free(hold[i]); err != nil {
				return err
			}
			hold = append(hold[:i], hold[i+1:]...)
		case k < 7:
			// A grant left open with bytes drawn: killed now, it is a
			// grant and a physical allocation the ledger must reclaim.
			gr, err := c.a.Reserve(contextBG, governor.Request{Holder: "h", Role: "open", Bytes: 64 << 10})
			if err == nil {
				_ = gr.Draw(32 << 10)
				if !ready {
					ready = true
					fmt.Println("ready")
				}
			}
		default:
			_ = c.a.Settle()
		}
		if len(hold) > 64 {
			_ = c.free(hold[0])
			hold = hold[1:]
		}
	}
}

// kill -9 of a child that holds grants and leases, at a random point: a
// survivor reclaims its slot within 1 s, the figures return to what the
// survivors hold (no drift), and the next child joins (no deadlock, even
// when the kill landed inside the file lock or between a writer's begin
// and end). MEMGEN_XPROC_TRIALS sets the trials (make xproc-soak: 1,000).
func TestKillNine(t *testing.T) {
	trials := envInt(trialsEnv, 6)
	path := ledgerPath(t)
	events := make(chan event, 64)
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: 256 << 20, Slots: 8}, Poll: 100 * time.Millisecond,
		onEvent: func(e event) {
			if e.Kind == eventReclaimed {
				events <- e
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	var took, watched, exits []time.Duration
	var held uint64
	for i := range trials {
		p := spawn(t, "churn", pathEnv+"="+path, seedEnv+"="+strconv.Itoa(i))
		p.expect(t, "ready")
		// Odd trials kill after the survivor's watcher has had a Poll to
		// open the child's pidfd (the steady state: the death wakes it);
		// even ones within 20 ms of the join, usually before (the next
		// period's scan finds it).
		pause := time.Duration(rng.IntN(20_000)) * time.Microsecond
		if i%2 == 1 {
			pause += 150 * time.Millisecond
		}
		time.Sleep(pause)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		reaped := make(chan time.Duration, 1)
		go func() { _ = p.cmd.Wait(); reaped <- time.Since(killed) }()
		var e event
	wait:
		for {
			select {
			case e = <-events:
				if e.PID == p.pid {
					break wait
				}
			case <-time.After(watchdog.Bound):
				t.Fatalf("watchdog: trial %d: child %d not reclaimed within %v", i, p.pid, watchdog.Bound)
			}
		}
		took = append(took, time.Since(killed))
		if i%2 == 1 {
			watched = append(watched, time.Since(killed))
		}
		exits = append(exits, <-reaped)
		held += e.Claim
		h, s := inspect(t, path)
		for _, x := range s {
			if x.PID != 0 && x.PID != os.Getpid() {
				t.Fatalf("trial %d: slot left behind: %v", i, x)
			}
		}
		if h.Claimed != 0 || h.Reserved != 0 || h.Charged != 0 || h.Pending != 0 || h.Dirty {
			t.Fatalf("trial %d: drift after the reclaim: %+v", i, h)
		}
	}
	slices.Sort(took)
	slices.Sort(watched)
	slices.Sort(exits)
	t.Logf("%d trials: reclaimed after the kill in %v (median), %v (99th percentile), %v (worst); killed once watched: %v (median), %v (worst); %d bytes claimed by the dead reclaimed",
		trials, took[len(took)/2], took[len(took)*99/100], took[len(took)-1], watched[len(watched)/2], watched[len(watched)-1], held)
	t.Logf("the kernel's part: the child reaped after the kill in %v (median), %v (99th percentile), %v (worst)",
		exits[len(exits)/2], exits[len(exits)*99/100], exits[len(exits)-1])
}
