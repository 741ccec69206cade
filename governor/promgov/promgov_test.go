package promgov_test

import (
	"context"
	"strings"
	"testing"
	"time"

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
	gr, err := g.Reserve(context.Background(), "host", "kv", "kv", 300, 0, time.Time{})
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
	if _, err := g.Reserve(context.Background(), "host", "kv", "kv", 700, 0, time.Time{}); err == nil {
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
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 20+11 {
		t.Fatalf("%d series, %v", n, err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	l.Release()
}
