package main

import (
	"testing"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/internal/xproctest"
)

// TestJoinWaitsForGiveBack: the ledger's room is held by a cache in
// another process (this test's, bound to the same ledger): llamaserve's
// load does not fit beside it, waits, and the cache's holder is asked
// through the ledger's wants and gives back; the engine then serves, and
// the ledger never charges more than its capacity.
func TestJoinWaitsForGiveBack(t *testing.T) {
	lib := need(t, "MEMGEN_LLAMACPP_LIB")
	tiny := need(t, "MEMGEN_LLAMACPP_MODEL")
	bin := build(t)
	const capacity, lease = 400 << 20, 4 << 20
	ledger := xproctest.NewLedger(t, capacity)
	cache := xproctest.Fill(t, ledger, lease, 16<<20) // all but 16 MiB: the tiny model's weights alone need more
	e := start(t, bin, "-lib", lib, "-model", tiny, "-nctx", "1024", "-sequences", "4", "-ledger", ledger, "-join-timeout", "2m")
	if toks := complete(t, e.addr, `{"prompt":[1,2,3,4],"max_tokens":8}`); len(toks) != 8 {
		t.Errorf("%d tokens, want 8", len(toks))
	}
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
	t.Logf("the cache gave back %d of %d leases of %d MiB (asked %d times); ledger %+v", cache.Gave(), cache.Held(), lease>>20, cache.Asked(), h)
	e.stop(t)
}
