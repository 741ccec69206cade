package governor

import (
	"context"
	"sync"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/watchdog"
)

// cacheHolder is a holder that reports what report says (nil: panics).
type cacheHolder struct {
	mu     sync.Mutex
	report func(memapi.AuthorityID) memapi.Bytes
	calls  int
}

func (c *cacheHolder) Reclaim(context.Context, Ticket) (memapi.Bytes, error) { return 0, nil }

func (c *cacheHolder) CachedBytes(a memapi.AuthorityID) memapi.Bytes {
	c.mu.Lock()
	c.calls++
	f := c.report
	c.mu.Unlock()
	return f(a)
}

func (c *cacheHolder) set(f func(memapi.AuthorityID) memapi.Bytes) {
	c.mu.Lock()
	c.report = f
	c.mu.Unlock()
}

// charge commits a lease of n bytes for holder on auth.
func charge(t *testing.T, g *Governor, auth memapi.AuthorityID, holder HolderID, n memapi.Bytes) Lease {
	t.Helper()
	gr, err := g.Reserve(context.Background(), Request{Authority: auth, Holder: holder, Role: "", Bytes: n})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(n); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func holderAuth(t *testing.T, s Snapshot, h HolderID, a memapi.AuthorityID) HolderAuthoritySnapshot {
	t.Helper()
	for _, hs := range s.Holders {
		if hs.ID != h {
			continue
		}
		for _, ha := range hs.Authorities {
			if ha.Authority == a {
				return ha
			}
		}
	}
	t.Fatalf("no account of %s on %s in %+v", h, a, s)
	return HolderAuthoritySnapshot{}
}

func authOf(t *testing.T, s Snapshot, a memapi.AuthorityID) AuthoritySnapshot {
	t.Helper()
	for _, as := range s.Authorities {
		if as.ID == a {
			return as
		}
	}
	t.Fatalf("no authority %s", a)
	return AuthoritySnapshot{}
}

func TestCachedBytesInSnapshot(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"dev": 1000, "host": 1000})
	pool := &cacheHolder{report: func(a memapi.AuthorityID) memapi.Bytes {
		if a == "dev" {
			return 300
		}
		return 40
	}}
	h.register("pool", pool, HolderOptions{Cache: true})
	h.register("kv", HolderFunc(func(context.Context, Ticket) (memapi.Bytes, error) { return 0, nil }), HolderOptions{})
	h.register("other", nil, HolderOptions{})
	charge(t, h.g, "dev", "pool", 500)
	charge(t, h.g, "host", "pool", 100)
	charge(t, h.g, "dev", "kv", 200)
	charge(t, h.g, "dev", "other", 100)

	s := h.g.Snapshot()
	dev := holderAuth(t, s, "pool", "dev")
	if dev.Charged != 500 || dev.Cached != 300 || dev.InUse() != 200 || dev.CacheClamped != 0 || dev.CacheErrors != 0 {
		t.Fatalf("pool on dev %+v", dev)
	}
	if host := holderAuth(t, s, "pool", "host"); host.Cached != 40 || host.InUse() != 60 {
		t.Fatalf("pool on host %+v", host)
	}
	// Holders that report no cache have all their charge in use.
	for _, id := range []HolderID{"kv", "other"} {
		if ha := holderAuth(t, s, id, "dev"); ha.Cached != 0 || ha.InUse() != ha.Charged {
			t.Fatalf("%s %+v", id, ha)
		}
	}
	if a := authOf(t, s, "dev"); a.Cached != 300 || a.Charged != 800 || !a.Balanced() {
		t.Fatalf("dev %+v", a)
	}
	if a, _ := h.g.Authority("dev"); a.Cached != 300 {
		t.Fatalf("Authority(dev).Cached = %d", a.Cached)
	}
	if a, _ := h.g.Authority("host"); a.Cached != 40 {
		t.Fatalf("Authority(host).Cached = %d", a.Cached)
	}
}

// A report above the charge that is not quarantined (a race with a growth,
// or a lie) is clamped, counted, and never makes in-use negative.
func TestCachedBytesClampedToCharge(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"dev": 1000})
	pool := &cacheHolder{report: func(memapi.AuthorityID) memapi.Bytes { return 900 }}
	h.register("pool", pool, HolderOptions{Cache: true})
	l := charge(t, h.g, "dev", "pool", 500)

	s := h.g.Snapshot()
	ha := holderAuth(t, s, "pool", "dev")
	if ha.Cached != 500 || ha.InUse() != 0 || ha.CacheClamped != 1 {
		t.Fatalf("clamped %+v", ha)
	}
	if a := authOf(t, s, "dev"); a.Cached != 500 {
		t.Fatalf("authority %+v", a)
	}
	// Quarantined bytes are never cache: the clamp leaves them out.
	if err := l.Quarantine(100); err != nil {
		t.Fatal(err)
	}
	ha = holderAuth(t, h.g.Snapshot(), "pool", "dev")
	if ha.Charged != 500 || ha.Quarantined != 100 || ha.Cached != 400 || ha.InUse() != 0 || ha.CacheClamped != 2 {
		t.Fatalf("with quarantine %+v", ha)
	}
	if a, _ := h.g.Authority("dev"); a.Cached != 400 {
		t.Fatalf("Authority %+v", a)
	}
	// An honest report is not clamped.
	pool.set(func(memapi.AuthorityID) memapi.Bytes { return 150 })
	ha = holderAuth(t, h.g.Snapshot(), "pool", "dev")
	if ha.Cached != 150 || ha.InUse() != 250 || ha.CacheClamped != 3 {
		t.Fatalf("honest %+v", ha)
	}
}

// A CachedBytes that panics counts as 0 and an error; the snapshot is
// complete and the next one asks again.
func TestCachedBytesPanicIsContained(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"dev": 1000, "host": 1000})
	bad := &cacheHolder{report: func(memapi.AuthorityID) memapi.Bytes { panic("report bug") }}
	good := &cacheHolder{report: func(memapi.AuthorityID) memapi.Bytes { return 10 }}
	h.register("bad", bad, HolderOptions{Cache: true})
	h.register("good", good, HolderOptions{Cache: true})
	charge(t, h.g, "dev", "bad", 100)
	charge(t, h.g, "host", "bad", 100)
	charge(t, h.g, "dev", "good", 100)

	s := h.g.Snapshot()
	if ha := holderAuth(t, s, "bad", "dev"); ha.Cached != 0 || ha.CacheErrors != 1 || ha.Charged != 100 {
		t.Fatalf("bad on dev %+v", ha)
	}
	if ha := holderAuth(t, s, "bad", "host"); ha.CacheErrors != 1 {
		t.Fatalf("bad on host %+v", ha)
	}
	if ha := holderAuth(t, s, "good", "dev"); ha.Cached != 10 || ha.CacheErrors != 0 {
		t.Fatalf("good %+v", ha)
	}
	if a := authOf(t, s, "dev"); a.Cached != 10 || !a.Balanced() {
		t.Fatalf("dev %+v", a)
	}
	if a, ok := h.g.Authority("dev"); !ok || a.Cached != 10 {
		t.Fatalf("Authority %+v", a)
	}
	// Fixed, it is read again; the count stays.
	bad.set(func(memapi.AuthorityID) memapi.Bytes { return 60 })
	if ha := holderAuth(t, h.g.Snapshot(), "bad", "dev"); ha.Cached != 60 || ha.CacheErrors != 2 {
		t.Fatalf("after the fix %+v", ha)
	}
	// The governor still works: a reservation after the panics.
	charge(t, h.g, "dev", "good", 10)
}

// CachedBytes runs with no governor lock held: it may reserve, commit and
// refund on the very authority being snapshotted (a pool that grows while
// a snapshot reads it) without deadlocking.
func TestCachedBytesCalledWithoutLocks(t *testing.T) {
	h := newHarness(t, map[memapi.AuthorityID]memapi.Bytes{"dev": 1000})
	pool := &cacheHolder{}
	pool.set(func(a memapi.AuthorityID) memapi.Bytes {
		gr, err := h.g.Reserve(context.Background(), Request{Authority: a, Holder: "pool", Role: "", Bytes: 10})
		if err != nil {
			panic(err)
		}
		_ = gr.Draw(10)
		l, err := gr.Commit()
		if err != nil {
			panic(err)
		}
		if err := l.Refund(10); err != nil {
			panic(err)
		}
		return 5
	})
	h.register("pool", pool, HolderOptions{Cache: true})
	charge(t, h.g, "dev", "pool", 100)
	done := make(chan Snapshot, 1)
	go func() { done <- h.g.Snapshot() }()
	s := watchdog.Recv(t, watchdog.Bound, "Snapshot with a CachedBytes that uses the governor", done)
	if ha := holderAuth(t, s, "pool", "dev"); ha.Cached != 5 || ha.CacheErrors != 0 {
		t.Fatalf("%+v", ha)
	}
	if a, _ := h.g.Authority("dev"); a.Cached != 5 || a.Charged != 100 {
		t.Fatalf("%+v", a)
	}
}
