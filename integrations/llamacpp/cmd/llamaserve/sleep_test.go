package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp"
	"github.com/memgen/memgen/internal/xproctest"
)

// TestSleepAfter: llamaserve -sleep-after puts the idle engine to sleep
// (at -sleep-level 1 and 2) and the next request wakes it; the
// completions before and after are the same, and /stats counts the sleeps
// and wakes.
func TestSleepAfter(t *testing.T) {
	lib := need(t, "MEMGEN_LLAMACPP_LIB")
	model := need(t, "MEMGEN_LLAMACPP_GQA_MODEL")
	bin := build(t)
	for _, level := range []string{"1", "2"} {
		t.Run("level"+level, func(t *testing.T) { sleepAfter(t, bin, lib, model, level) })
	}
}

func sleepAfter(t *testing.T, bin, lib, model, level string) {
	e := start(t, bin, "-lib", lib, "-model", model, "-budget", "64MiB", "-sequences", "2", "-nctx", "512", "-sleep-after", "50ms", "-sleep-level", level)
	type stats struct {
		Sleeps, Wakes, SleepErrors int64
		Asleep                     bool
	}
	read := func() stats {
		t.Helper()
		resp, err := http.Get("http://" + e.addr + "/stats")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var s stats
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	awaitAsleep := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !read().Asleep; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the idle engine did not sleep within 30 s: %+v", read())
			}
		}
	}
	const body = `{"prompt": "The ledger is", "max_tokens": 8}`
	awaitAsleep()
	first := complete(t, e.addr, body)
	awaitAsleep()
	second := complete(t, e.addr, body)
	// The line scripts/llamacpp.sh sleepwake counts.
	same := len(first) > 0 && slices.Equal(first, second)
	t.Logf("sleepwake: tokens-identical=%v (llamaserve -sleep-level %s: a request after a wake against one before the sleep)", map[bool]string{true: "yes", false: "no"}[same], level)
	if !same {
		t.Fatalf("after a wake %v, before %v", second, first)
	}
	if s := read(); s.Sleeps < 2 || s.Wakes < 2 || s.SleepErrors != 0 {
		t.Fatalf("stats %+v: want at least two sleeps and wakes", s)
	}
	e.stop(t)
}

// TestSleepOnWant: llamaserve -sleep-on-want on a shared ledger, idle,
// holds most of it; another process on the ledger (this test's) reserves
// more than is free, with a deadline: its want reaches llamaserve as
// pressure tickets to its holders, the engine sleeps (at -sleep-level 1
// and 2) and the want is served from the bytes it gave back. The ledger
// is exact: its totals are the sum of the slots, llamaserve's slot is what
// its governor charges, and its weights charge nothing. Once the test
// gives its bytes back, the next request wakes the engine and gets the
// tokens of the request before the sleep.
func TestSleepOnWant(t *testing.T) {
	lib := need(t, "MEMGEN_LLAMACPP_LIB")
	model := need(t, "MEMGEN_LLAMACPP_MODEL")
	bin := build(t)
	for _, level := range []string{"1", "2"} {
		t.Run("level"+level, func(t *testing.T) { sleepOnWant(t, bin, lib, model, level) })
	}
}

func sleepOnWant(t *testing.T, bin, lib, model, level string) {
	const capacity = 128 << 20
	ledger := xproctest.NewLedger(t, capacity)
	e := start(t, bin, "-lib", lib, "-model", model, "-nctx", "1024", "-sequences", "4", "-ledger", ledger, "-sleep-on-want", "-sleep-level", level)
	const body = `{"prompt":[1,2,3,4],"max_tokens":8}`
	first := complete(t, e.addr, body)

	l, err := xproc.Open(ledger, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := governor.New(governor.Options{})
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		g.Close()
	})
	if err := l.Bind(g, "host"); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("want", nil, governor.HolderOptions{}); err != nil {
		t.Fatal(err)
	}
	weights := metric(t, e.addr, `memgen_governor_holder_charged_bytes{authority="host",holder="llama/weights"}`)
	charged := metric(t, e.addr, `memgen_governor_charged_bytes{authority="host"}`)
	if weights < 64<<20 {
		t.Fatalf("llamaserve's weights charge %d bytes", weights)
	}
	// More than the ledger has free beside llamaserve, less than it has
	// once the weights are given back.
	want := memapi.Bytes(capacity-charged+weights/2) &^ (64<<10 - 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	gr, err := g.Reserve(ctx, governor.Request{Authority: "host", Holder: "want", Role: "room", Bytes: want})
	if err != nil {
		t.Fatalf("a want of %d bytes (llamaserve charged %d, its weights %d, of %d): %v; llamaserve: %+v", want, charged, weights, capacity, err, serveStats(t, e.addr))
	}
	st := serveStats(t, e.addr)
	if !st.Asleep || st.PressureSleeps < 1 || st.PressureFreed < memapi.Bytes(weights) {
		t.Fatalf("after the want was served: llamaserve's stats %+v, want it asleep with the weights' %d bytes given back", st, weights)
	}
	if w := metric(t, e.addr, `memgen_governor_holder_charged_bytes{authority="host",holder="llama/weights"}`); w != 0 {
		t.Fatalf("asleep, the weights charge %d bytes", w)
	}
	t.Logf("level %s: a want of %d bytes served in %v: llamaserve slept and gave back %d bytes (weights %d)", level, want, time.Since(start).Round(time.Millisecond), st.PressureFreed, weights)
	// The ledger is exact once llamaserve's settler published its figures.
	deadline := time.Now().Add(10 * time.Second)
	for {
		h, slots, err := xproc.Inspect(ledger)
		if err != nil {
			t.Fatal(err)
		}
		var claimed, chargedSum uint64
		var theirs *xproc.Slot
		for i, s := range slots {
			claimed += s.Claim
			chargedSum += s.Charged
			if s.PID == e.cmd.Process.Pid {
				theirs = &slots[i]
			}
		}
		now := metric(t, e.addr, `memgen_governor_charged_bytes{authority="host"}`)
		exact := theirs != nil && h.Claimed == claimed && h.Charged == chargedSum && h.Claimed <= h.Capacity && theirs.Charged == now && now <= charged-weights
		// The slot shows the sleep too (memctl show): its level, and at
		// level 1 the weights on the host tier.
		noted := theirs != nil && theirs.Sleeps >= 1 && strconv.Itoa(theirs.Asleep) == level && theirs.Last.Kind == "sleep" &&
			(level == "2" || theirs.Host >= weights)
		if exact && noted {
			t.Logf("ledger: capacity %d, claimed %d, charged %d; llamaserve's slot charged %d (was %d), asleep at level %d, host tier %d, last move %+v",
				h.Capacity, h.Claimed, h.Charged, theirs.Charged, charged, theirs.Asleep, theirs.Host, theirs.Last)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger %+v, llamaserve's slot %+v, its governor charged %d (was %d, weights %d): not exact, or the sleep not noted", h, theirs, now, charged, weights)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := gr.Cancel(); err != nil {
		t.Fatal(err)
	}
	second := complete(t, e.addr, body)
	same := len(first) > 0 && slices.Equal(first, second)
	t.Logf("sleepwake: tokens-identical=%s (llamaserve -sleep-on-want -sleep-level %s: a request after the sleep a want made)", map[bool]string{true: "yes", false: "no"}[same], level)
	if !same {
		t.Fatalf("after the wake %v, before the sleep %v", second, first)
	}
	if st := serveStats(t, e.addr); st.Asleep || st.Wakes < 1 {
		t.Fatalf("after the next request: %+v", st)
	}
	// The wake is noted in the slot: awake, its level, the host tier empty
	// again at level 1.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, slots, err := xproc.Inspect(ledger)
		if err != nil {
			t.Fatal(err)
		}
		var theirs xproc.Slot
		for _, s := range slots {
			if s.PID == e.cmd.Process.Pid {
				theirs = s
			}
		}
		if theirs.Wakes >= 1 && theirs.Asleep == 0 && theirs.Last.Kind == "wake" && strconv.Itoa(theirs.Last.Level) == level && (level == "2" || theirs.Host < weights) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the wake llamaserve's slot is %+v", theirs)
		}
	}
	e.stop(t)
}

// serveStats is llamaserve's /stats.
func serveStats(t *testing.T, addr string) llamacpp.ServerStats {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s llamacpp.ServerStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// metric is the value of the series named (with its labels, as
// Prometheus's text format writes them) on llamaserve's /metrics.
func metric(t *testing.T, addr, series string) uint64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return uint64(f)
		}
	}
	t.Fatalf("no %s on /metrics", series)
	return 0
}
