package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/xproctest"
)

// TestJoinWaitsForGiveBack: the ledger's room is held by a cache in
// another process (this test's, bound to the same ledger), all but 8 MiB:
// ortserve's plan (16 MiB at start) says it fits after others give back;
// its load waits (-join-timeout), the cache's holder is asked through the
// ledger's wants and gives back, and the engine serves a completion, the
// ledger never charging more than its capacity.
func TestJoinWaitsForGiveBack(t *testing.T) {
	lib := need(t, "MEMGEN_ORT_LIB")
	model := need(t, "MEMGEN_ORT_DECODER_MODEL")
	bin := buildServe(t)
	const capacity, lease = 128 << 20, 4 << 20
	ledger := xproctest.NewLedger(t, capacity)
	cache := xproctest.Fill(t, ledger, lease, 8<<20)
	url, cmd := startServe(t, bin, 2*time.Minute, "-lib", lib, "-model", model, "-listen", "127.0.0.1:0", "-sequences", "2", "-nctx", "256", "-ledger", ledger, "-join-timeout", "2m")
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3,4],"max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Choices []struct {
			Tokens []int64 `json:"tokens"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || len(out.Choices) != 1 || len(out.Choices[0].Tokens) != 8 {
		t.Errorf("completion: %d %+v %v", resp.StatusCode, out, err)
	}
	resp.Body.Close()
	if cache.Asked() == 0 || cache.Gave() == 0 {
		t.Errorf("the cache was asked %d times and gave back %d leases: the engine cannot have fit without them", cache.Asked(), cache.Gave())
	}
	h, _, err := xproc.Inspect(ledger)
	if err != nil {
		t.Fatal(err)
	}
	if h.Charged > h.Capacity || h.Claimed > h.Capacity {
		t.Errorf("the ledger overcommitted: %+v", h)
	}
	t.Logf("the cache gave back %d of %d leases of %d MiB (asked %d times); ledger charged %d of %d", cache.Gave(), cache.Held(), lease>>20, cache.Asked(), h.Charged, h.Capacity)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v", err)
	}
}
