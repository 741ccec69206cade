package promgov_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/memgen/memgen/governor/promgov"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The ledger collector exports the shared totals and one series per
// process, its host tier among them; a bad file fails the scrape with the
// typed error.
func TestLedgerCollector(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	l, err := xproc.Open(path, xproc.Options{Create: &xproc.CreateOptions{Capacity: 4096, Slots: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(promgov.NewLedgerCollector(path)); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(os.Getpid())
	want := `
# HELP memgen_xproc_capacity_bytes The shared capacity.
# TYPE memgen_xproc_capacity_bytes gauge
memgen_xproc_capacity_bytes{ledger="` + path + `"} 4096
# HELP memgen_xproc_process_claim_bytes Bytes of the shared capacity the process holds.
# TYPE memgen_xproc_process_claim_bytes gauge
memgen_xproc_process_claim_bytes{ledger="` + path + `",pid="` + pid + `",slot="0"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "memgen_xproc_capacity_bytes", "memgen_xproc_process_claim_bytes"); err != nil {
		t.Fatal(err)
	}

	// The process's host tier, as it noted its moves: a sleep at level 1
	// (64 bytes to the host), then an offload (32 more).
	if err := l.Note(xproc.TierEvent{Kind: "sleep", Level: 1, Bytes: 64, Host: 64}); err != nil {
		t.Fatal(err)
	}
	if err := l.Note(xproc.TierEvent{Kind: "offload", Bytes: 32, Host: 96}); err != nil {
		t.Fatal(err)
	}
	series := func(name, kind, help, value string) string {
		return "# HELP memgen_xproc_process_" + name + " " + help + "\n# TYPE memgen_xproc_process_" + name + " " + kind + "\n" +
			"memgen_xproc_process_" + name + `{ledger="` + path + `",pid="` + pid + `",slot="0"} ` + value + "\n"
	}
	want = series("host_tier_bytes", "gauge", "Bytes the process holds in its host tier, as it last noted them.", "96") +
		series("sleep_level", "gauge", "The level the process's engine sleeps at (0: awake).", "1") +
		series("sleeps_total", "counter", "Times the process's engine went to sleep.", "1") +
		series("wakes_total", "counter", "Times the process's engine woke.", "0") +
		series("offloads_total", "counter", "Moves of the process's memory to its host tier (a sequence's KV cache).", "1") +
		series("restores_total", "counter", "Moves of the process's memory back from its host tier.", "0")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"memgen_xproc_process_host_tier_bytes", "memgen_xproc_process_sleep_level", "memgen_xproc_process_sleeps_total",
		"memgen_xproc_process_wakes_total", "memgen_xproc_process_offloads_total", "memgen_xproc_process_restores_total"); err != nil {
		t.Fatal(err)
	}

	bad := prometheus.NewPedanticRegistry()
	_ = bad.Register(promgov.NewLedgerCollector(filepath.Join(t.TempDir(), "missing")))
	if _, err := bad.Gather(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("scrape of a missing file: %v", err)
	}
}
