// Package promgov exports a governor's figures as Prometheus metrics. It
// lives apart from package governor so the ledger itself depends on nothing
// but the contract.
//
// Every scrape takes one governor.Snapshot and turns it into metrics named
// memgen_governor_*: per authority the ledger (capacity, reserved, charged,
// pending, free bytes, ...) and its counters (grants, waits, tickets, ...),
// and per holder and authority its figures (charged split into in use,
// cached and quarantined) and the tickets it was handed.
package promgov

import (
	"github.com/memgen/memgen/governor"
	"github.com/prometheus/client_golang/prometheus"
)

// Source is what the collector reads: *governor.Governor implements it.
type Source interface {
	Snapshot() governor.Snapshot
}

// Collector is a prometheus.Collector over a Source.
type Collector struct {
	src Source
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector for src; register it with a
// prometheus.Registerer.
func NewCollector(src Source) *Collector { return &Collector{src: src} }

type authMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(governor.AuthoritySnapshot) float64
}

type holderMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(governor.HolderAuthoritySnapshot) float64
}

func authDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("memgen", "governor", name), help, []string{"authority"}, nil)
}

func holderDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName("memgen", "governor", "holder_"+name), help, []string{"authority", "holder"}, nil)
}

var (
	gauge   = prometheus.GaugeValue
	counter = prometheus.CounterValue
)

var authMetrics = []authMetric{
	{authDesc("capacity_bytes", "Capacity of the authority."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Capacity) }},
	{authDesc("reserved_bytes", "Bytes of open grants, plus drawn bytes of expired grants awaiting rollback."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Reserved) }},
	{authDesc("charged_bytes", "Bytes charged to holders through leases."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Charged) }},
	{authDesc("pending_bytes", "Bytes released by holders and waiting for fences before their free."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Pending) }},
	{authDesc("free_bytes", "Free bytes: capacity - reserved - charged - pending."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Free) }},
	{authDesc("expired_drawn_bytes", "Drawn bytes of grants reclaimed after their deadline, still installed."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.ExpiredDrawn) }},
	{authDesc("quarantined_bytes", "Charged bytes whose free failed: still held by their mechanism, waiting for a retry."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Quarantined) }},
	{authDesc("cached_bytes", "Charged bytes its holders report as cache (governor.CacheReporter): held for reuse, given back without evicting data."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Cached) }},
	{authDesc("reclaimable_bytes", "Charged bytes over their holders' guarantees, of holders that can reclaim."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Reclaimable) }},
	{authDesc("waiters", "Reservations queued for bytes."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Waiters) }},
	{authDesc("waiting_bytes", "Bytes of the queued reservations."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.WaitingBytes) }},
	{authDesc("open_grants", "Open grants."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Grants) }},
	{authDesc("leases", "Leases holding bytes."), gauge, func(s governor.AuthoritySnapshot) float64 { return float64(s.Leases) }},
	{authDesc("grants_total", "Grants made."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.Granted) }},
	{authDesc("waits_total", "Reservations that had to queue."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.Waited) }},
	{authDesc("over_budget_total", "Reservations that failed over budget or over a holder limit."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.OverBudget) }},
	{authDesc("cancelled_waits_total", "Waits that ended by context or deadline."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.Cancelled) }},
	{authDesc("expired_grants_total", "Grants reclaimed after their deadline."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.ExpiredGrants) }},
	{authDesc("pressure_events_total", "Reservations that did not fit and computed a shortfall."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.PressureEvents) }},
	{authDesc("tickets_total", "Pressure tickets handed to holders."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.Tickets) }},
	{authDesc("reclaimed_bytes_total", "Bytes holders reported freeing for tickets."), counter, func(s governor.AuthoritySnapshot) float64 { return float64(s.Freed) }},
}

var holderMetrics = []holderMetric{
	{holderDesc("guarantee_bytes", "The holder's guarantee on the authority (never asked for)."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Guarantee) }},
	{holderDesc("limit_bytes", "The holder's limit on the authority (0: none)."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Limit) }},
	{holderDesc("reserved_bytes", "The holder's reserved bytes."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Reserved) }},
	{holderDesc("charged_bytes", "The holder's charged bytes."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Charged) }},
	{holderDesc("pending_bytes", "The holder's pending bytes."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Pending) }},
	{holderDesc("quarantined_bytes", "The holder's charged bytes whose free failed, waiting for a retry."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Quarantined) }},
	{holderDesc("cached_bytes", "The holder's charged bytes it reports as cache (governor.CacheReporter), at most charged - quarantined."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Cached) }},
	{holderDesc("in_use_bytes", "The holder's charged bytes holding data: charged - cached - quarantined."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.InUse()) }},
	{holderDesc("waiting_bytes", "Bytes of the holder's queued reservations."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Waiting) }},
	{holderDesc("reclaimable_bytes", "The holder's charged bytes over its guarantee not yet asked for."), gauge, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Reclaimable) }},
	{holderDesc("tickets_total", "Pressure tickets handed to the holder."), counter, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Tickets) }},
	{holderDesc("reclaimed_bytes_total", "Bytes the holder reported freeing."), counter, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.Freed) }},
	{holderDesc("reclaim_errors_total", "Reclaim calls that returned an error."), counter, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.ReclaimErrors) }},
	{holderDesc("cache_clamped_total", "Snapshots whose cache report exceeded the holder's charge not quarantined and was clamped."), counter, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.CacheClamped) }},
	{holderDesc("cache_errors_total", "Snapshots whose cache report panicked (counted as 0 cached bytes)."), counter, func(s governor.HolderAuthoritySnapshot) float64 { return float64(s.CacheErrors) }},
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range authMetrics {
		ch <- m.desc
	}
	for _, m := range holderMetrics {
		ch <- m.desc
	}
}

// Collect takes a snapshot and sends its figures.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	for _, a := range s.Authorities {
		for _, m := range authMetrics {
			ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(a), string(a.ID))
		}
	}
	for _, h := range s.Holders {
		for _, ha := range h.Authorities {
			for _, m := range holderMetrics {
				ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(ha), string(ha.Authority), string(h.ID))
			}
		}
	}
}
