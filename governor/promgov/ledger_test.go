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
// process; a bad file fails the scrape with the typed error.
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
	bad := prometheus.NewPedanticRegistry()
	_ = bad.Register(promgov.NewLedgerCollector(filepath.Join(t.TempDir(), "missing")))
	if _, err := bad.Gather(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("scrape of a missing file: %v", err)
	}
}
