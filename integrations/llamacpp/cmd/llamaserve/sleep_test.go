package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"
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
