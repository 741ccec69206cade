package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
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
	ledger := newLedger(t, capacity)
	l, err := xproc.Open(ledger, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := governor.New(governor.Options{})
	a, err := l.Bind(g, "host")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		leases []governor.Lease
		asked  atomic.Int64
	)
	cache := governor.HolderFunc(func(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		asked.Add(1)
		mu.Lock()
		defer mu.Unlock()
		var n memapi.Bytes
		for n < tk.Wanted && len(leases) > 0 {
			if err := leases[0].Refund(lease); err != nil {
				return n, err
			}
			leases, n = leases[1:], n+lease
		}
		return n, nil
	})
	if err := g.Register("cache", cache, governor.HolderOptions{Cache: true}); err != nil {
		t.Fatal(err)
	}
	for range (capacity - 16<<20) / lease { // all but 16 MiB: the tiny model's weights alone need more
		gr, err := a.Reserve(context.Background(), governor.Request{Holder: "cache", Role: "blocks", Bytes: lease})
		if err != nil {
			t.Fatal(err)
		}
		if err := gr.Draw(lease); err != nil {
			t.Fatal(err)
		}
		ls, err := gr.Commit()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock() // the holder reads leases from the ledger's goroutine
		leases = append(leases, ls)
		mu.Unlock()
	}
	mu.Lock()
	held := len(leases)
	mu.Unlock()
	t.Cleanup(func() {
		mu.Lock()
		for _, ls := range leases {
			_ = ls.Refund(lease)
		}
		mu.Unlock()
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		_ = g.Close()
	})
	e := start(t, bin, "-lib", lib, "-model", tiny, "-nctx", "1024", "-sequences", "4", "-ledger", ledger, "-join-timeout", "2m")
	if toks := complete(t, e.addr, `{"prompt":[1,2,3,4],"max_tokens":8}`); len(toks) != 8 {
		t.Errorf("%d tokens, want 8", len(toks))
	}
	mu.Lock()
	gave := held - len(leases)
	mu.Unlock()
	if asked.Load() == 0 || gave == 0 {
		t.Errorf("the cache was asked %d times and gave back %d leases: the engine cannot have fit without them", asked.Load(), gave)
	}
	h, _, err := xproc.Inspect(ledger)
	if err != nil {
		t.Fatal(err)
	}
	if h.Charged > h.Capacity || h.Claimed > h.Capacity {
		t.Errorf("the ledger overcommitted: %+v", h)
	}
	t.Logf("the cache gave back %d of %d leases of %d MiB (asked %d times); ledger %+v", gave, held, lease>>20, asked.Load(), h)
	e.stop(t)
}
