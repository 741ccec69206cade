// Package xproctest helps tests that share a ledger (governor/xproc)
// between processes: Fill holds the ledger's room in the test's own
// process with a cache that gives it back when another process asks
// through the ledger's wants.
package xproctest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
)

// Cache is the room Fill holds: leases of the "cache" holder, a cache
// (governor.HolderOptions.Cache) that refunds its oldest leases when a
// ticket asks.
type Cache struct {
	lease memapi.Bytes
	held  int
	asked atomic.Int64

	mu     sync.Mutex // the holder runs on the ledger's goroutine
	leases []governor.Lease
}

// Fill joins the ledger at path from this process (xproc.Open, its
// authority "host" bound to a governor of its own) and holds all of its
// capacity but leave in leases of lease bytes. The test's cleanup refunds
// what is left and closes the ledger.
func Fill(t testing.TB, path string, lease, leave memapi.Bytes) *Cache {
	t.Helper()
	h, _, err := xproc.Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := xproc.Open(path, xproc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := governor.New(governor.Options{})
	if err := l.Bind(g, "host"); err != nil {
		t.Fatal(err)
	}
	c := &Cache{lease: lease}
	if err := g.Register("cache", governor.HolderFunc(c.reclaim), governor.HolderOptions{Cache: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		for _, ls := range c.leases {
			_ = ls.Refund(lease)
		}
		c.leases = nil
		c.mu.Unlock()
		if err := l.Close(); err != nil {
			t.Error(err)
		}
		_ = g.Close()
	})
	for range (memapi.Bytes(h.Capacity) - leave) / lease {
		gr, err := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "cache", Role: "blocks", Bytes: lease})
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
		c.mu.Lock()
		c.leases = append(c.leases, ls)
		c.held++
		c.mu.Unlock()
	}
	return c
}

// reclaim answers a ticket: the oldest leases, until it is covered.
func (c *Cache) reclaim(ctx context.Context, tk governor.Ticket) (memapi.Bytes, error) {
	c.asked.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	var n memapi.Bytes
	for n < tk.Wanted && len(c.leases) > 0 {
		if err := c.leases[0].Refund(c.lease); err != nil {
			return n, err
		}
		c.leases, n = c.leases[1:], n+c.lease
	}
	return n, nil
}

// Held is how many leases Fill took.
func (c *Cache) Held() int { return c.held }

// Gave is how many leases the cache has given back.
func (c *Cache) Gave() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held - len(c.leases)
}

// Asked is how many tickets the cache was asked.
func (c *Cache) Asked() int64 { return c.asked.Load() }
