package promgov

import (
	"strconv"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/prometheus/client_golang/prometheus"
)

// LedgerCollector is a prometheus.Collector over a ledger file shared by
// several processes (package governor/xproc): every scrape reads the file
// (xproc.Inspect, under its shared lock) and exports its totals as
// memgen_xproc_* and each taken slot's figures as memgen_xproc_process_*,
// labelled with the slot and the process's PID. A scrape of a missing or
// bad file reports the typed error as an invalid metric.
type LedgerCollector struct {
	path string
}

var _ prometheus.Collector = (*LedgerCollector)(nil)

// NewLedgerCollector returns a collector for the ledger file at path.
func NewLedgerCollector(path string) *LedgerCollector { return &LedgerCollector{path: path} }

func ledgerDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("memgen", "xproc", name), help, []string{"ledger"}, nil)
}

func processDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("memgen", "xproc", "process_"+name), help, []string{"ledger", "slot", "pid"}, nil)
}

type ledgerMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(xproc.Header) float64
}

type processMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(xproc.Slot) float64
}

var ledgerMetrics = []ledgerMetric{
	{ledgerDesc("capacity_bytes", "The shared capacity."), gauge, func(h xproc.Header) float64 { return float64(h.Capacity) }},
	{ledgerDesc("revision", "The limits' revision."), gauge, func(h xproc.Header) float64 { return float64(h.Revision) }},
	{ledgerDesc("claimed_bytes", "Bytes the processes have claimed."), gauge, func(h xproc.Header) float64 { return float64(h.Claimed) }},
	{ledgerDesc("reserved_bytes", "Reserved bytes, as the processes last settled them."), gauge, func(h xproc.Header) float64 { return float64(h.Reserved) }},
	{ledgerDesc("charged_bytes", "Charged bytes, as the processes last settled them."), gauge, func(h xproc.Header) float64 { return float64(h.Charged) }},
	{ledgerDesc("pending_bytes", "Pending bytes, as the processes last settled them."), gauge, func(h xproc.Header) float64 { return float64(h.Pending) }},
	{ledgerDesc("wanted_bytes", "Bytes a waiting reservation could not claim."), gauge, func(h xproc.Header) float64 { return float64(h.Want) }},
	{ledgerDesc("reclaimed_slots_total", "Slots of dead processes reclaimed."), counter, func(h xproc.Header) float64 { return float64(h.Reclaims) }},
	{ledgerDesc("repairs_total", "Totals recomputed after a writer died mid-update."), counter, func(h xproc.Header) float64 { return float64(h.Repairs) }},
}

var processMetrics = []processMetric{
	{processDesc("claim_bytes", "Bytes of the shared capacity the process holds."), gauge, func(s xproc.Slot) float64 { return float64(s.Claim) }},
	{processDesc("reserved_bytes", "The process's reserved bytes."), gauge, func(s xproc.Slot) float64 { return float64(s.Reserved) }},
	{processDesc("charged_bytes", "The process's charged bytes."), gauge, func(s xproc.Slot) float64 { return float64(s.Charged) }},
	{processDesc("pending_bytes", "The process's pending bytes."), gauge, func(s xproc.Slot) float64 { return float64(s.Pending) }},
	{processDesc("private_bytes", "Device memory the process's mechanisms keep for themselves."), gauge, func(s xproc.Slot) float64 { return float64(s.Private) }},
	{processDesc("wanted_bytes", "Bytes the process's waiting reservations lack."), gauge, func(s xproc.Slot) float64 { return float64(s.Want) }},
	{processDesc("host_tier_bytes", "Bytes the process holds in its host tier, as it last noted them."), gauge, func(s xproc.Slot) float64 { return float64(s.Host) }},
	{processDesc("sleep_level", "The level the process's engine sleeps at (0: awake)."), gauge, func(s xproc.Slot) float64 { return float64(s.Asleep) }},
	{processDesc("sleeps_total", "Times the process's engine went to sleep."), counter, func(s xproc.Slot) float64 { return float64(s.Sleeps) }},
	{processDesc("wakes_total", "Times the process's engine woke."), counter, func(s xproc.Slot) float64 { return float64(s.Wakes) }},
	{processDesc("offloads_total", "Moves of the process's memory to its host tier (a sequence's KV cache)."), counter, func(s xproc.Slot) float64 { return float64(s.Offloads) }},
	{processDesc("restores_total", "Moves of the process's memory back from its host tier."), counter, func(s xproc.Slot) float64 { return float64(s.Restores) }},
}

// Describe sends every metric's description.
func (c *LedgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range ledgerMetrics {
		ch <- m.desc
	}
	for _, m := range processMetrics {
		ch <- m.desc
	}
}

// Collect reads the file and sends its figures.
func (c *LedgerCollector) Collect(ch chan<- prometheus.Metric) {
	h, slots, err := xproc.Inspect(c.path)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(ledgerMetrics[0].desc, err)
		return
	}
	for _, m := range ledgerMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(h), c.path)
	}
	for _, s := range slots {
		if s.PID == 0 {
			continue
		}
		for _, m := range processMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(s), c.path, strconv.Itoa(s.Index), strconv.Itoa(s.PID))
		}
	}
}
