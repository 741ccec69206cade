package promgov_test

import (
	"context"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/promgov"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestCollectorExportsTheLedger(t *testing.T) {
	g := governor.New(governor.Options{})
	defer g.Close()
	if err := g.AddAuthority("host", 1000); err != nil {
		t.Fatal(err)
	}
	if err := g.Register("kv", nil, governor.HolderOptions{
		Guarantee: map[memapi.AuthorityID]memapi.Bytes{"host": 100},
		Limit:     map[memapi.AuthorityID]memapi.Bytes{"host": 800},
	}); err != nil {
		t.Fatal(err)
	}
	gr, err := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "kv", Role: "kv", Bytes: 300})
	if err != nil {
		t.Fatal(err)
	}
	if err := gr.Draw(200); err != nil {
		t.Fatal(err)
	}
	l, err := gr.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.MarkPending(50); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reserve(context.Background(), governor.Request{Authority: "host", Holder: "kv", Role: "kv", Bytes: 700}); err == nil {
		t.Fatal("reservation over the holder's limit succeeded")
	}

	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(promgov.NewCollector(g)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP memgen_governor_capacity_bytes Capacity of the authority.
# TYPE memgen_governor_capacity_bytes gauge
memgen_governor_capacity_bytes{authority="host"} 1000
# HELP memgen_governor_charged_bytes Bytes charged to holders through leases.
# TYPE memgen_governor_charged_bytes gauge
memgen_governor_charged_bytes{authority="host"} 150
# HELP memgen_governor_free_bytes Free bytes: capacity - reserved - charged - pending.
# TYPE memgen_governor_free_bytes gauge
memgen_governor_free_bytes{authority="host"} 800
# HELP memgen_governor_pending_bytes Bytes released by holders and waiting for fences before their free.
# TYPE memgen_governor_pending_bytes gauge
memgen_governor_pending_bytes{authority="host"} 50
# HELP memgen_governor_reserved_bytes Bytes of open grants, plus drawn bytes of expired grants awaiting rollback.
# TYPE memgen_governor_reserved_bytes gauge
memgen_governor_reserved_bytes{authority="host"} 0
# HELP memgen_governor_over_budget_total Reservations that failed over budget or over a holder limit.
# TYPE memgen_governor_over_budget_total counter
memgen_governor_over_budget_total{authority="host"} 1
# HELP memgen_governor_holder_charged_bytes The holder's charged bytes.
# TYPE memgen_governor_holder_charged_bytes gauge
memgen_governor_holder_charged_bytes{authority="host",holder="kv"} 150
# HELP memgen_governor_holder_limit_bytes The holder's limit on the authority (0: none).
# TYPE memgen_governor_holder_limit_bytes gauge
memgen_governor_holder_limit_bytes{authority="host",holder="kv"} 800
# HELP memgen_governor_holder_reclaimable_bytes The holder's charged bytes over its guarantee not yet asked for.
# TYPE memgen_governor_holder_reclaimable_bytes gauge
memgen_governor_holder_reclaimable_bytes{authority="host",holder="kv"} 0
`
	names := []string{
		"memgen_governor_capacity_bytes", "memgen_governor_charged_bytes", "memgen_governor_free_bytes",
		"memgen_governor_pending_bytes", "memgen_governor_reserved_bytes", "memgen_governor_over_budget_total",
		"memgen_governor_holder_charged_bytes", "memgen_governor_holder_limit_bytes", "memgen_governor_holder_reclaimable_bytes",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 21+15 {
		t.Fatalf("%d series, %v", n, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if err := l.Refund(l.Bytes()); err != nil {
		t.Fatal(err)
	}
}

// cacheHolder reports a fixed cache on every authority.
type cacheHolder memapi.Bytes

func (cacheHolder) Reclaim(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }

func (c cacheHolder) CachedBytes(memapi.AuthorityID) memapi.Bytes { return memapi.Bytes(c) }

func TestCollectorExportsCachedBytes(t *testing.T) {
	g := governor.New(governor.Options{})
	defer g.Close()
	if err := g.AddAuthority("dev", 1000); err != nil {
		t.Fatal(err)
	}
	for id, h := range map[governor.HolderID]governor.Holder{"pool": cacheHolder(150), "liar": cacheHolder(900), "kv": nil} {
		if err := g.Register(id, h, governor.HolderOptions{Cache: h != nil}); err != nil {
			t.Fatal(err)
		}
	}
	var leases []governor.Lease
	for id, n := range map[governor.HolderID]memapi.Bytes{"pool": 400, "liar": 200, "kv": 100} {
		gr, err := g.Reserve(context.Background(), governor.Request{Authority: "dev", Holder: id, Role: "", Bytes: n})
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
		leases = append(leases, l)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(promgov.NewCollector(g)); err != nil {
		t.Fatal(err)
	}
	// The liar's 900 is clamped to its 200 charged: the authority's cache is
	// 150 + 200, and the scrape counts the clamp.
	want := `
# HELP memgen_governor_cached_bytes Charged bytes its holders report as cache (governor.CacheReporter): held for reuse, given back without evicting data.
# TYPE memgen_governor_cached_bytes gauge
memgen_governor_cached_bytes{authority="dev"} 350
# HELP memgen_governor_holder_cached_bytes The holder's charged bytes it reports as cache (governor.CacheReporter), at most charged - quarantined.
# TYPE memgen_governor_holder_cached_bytes gauge
memgen_governor_holder_cached_bytes{authority="dev",holder="kv"} 0
memgen_governor_holder_cached_bytes{authority="dev",holder="liar"} 200
memgen_governor_holder_cached_bytes{authority="dev",holder="pool"} 150
# HELP memgen_governor_holder_in_use_bytes The holder's charged bytes holding data: charged - cached - quarantined.
# TYPE memgen_governor_holder_in_use_bytes gauge
memgen_governor_holder_in_use_bytes{authority="dev",holder="kv"} 100
memgen_governor_holder_in_use_bytes{authority="dev",holder="liar"} 0
memgen_governor_holder_in_use_bytes{authority="dev",holder="pool"} 250
# HELP memgen_governor_holder_cache_clamped_total Snapshots whose cache report exceeded the holder's charge not quarantined and was clamped.
# TYPE memgen_governor_holder_cache_clamped_total counter
memgen_governor_holder_cache_clamped_total{authority="dev",holder="kv"} 0
memgen_governor_holder_cache_clamped_total{authority="dev",holder="liar"} 1
memgen_governor_holder_cache_clamped_total{authority="dev",holder="pool"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "memgen_governor_cached_bytes", "memgen_governor_holder_cached_bytes",
		"memgen_governor_holder_in_use_bytes", "memgen_governor_holder_cache_clamped_total"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	for _, l := range leases {
		if err := l.Refund(l.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
}
