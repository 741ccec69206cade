package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memreport"
)

// row is one line of the summary table.
type row struct{ key, value string }

func fmtBytes(n memapi.Bytes) string { return memreport.FormatBytes(n) }

func pct(a, b memapi.Bytes) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// summaryRows builds the summary of a run and, when static is not nil, its
// comparison with the static baseline.
func summaryRows(cfg Config, o *Outcome, static *Figures) []row {
	kernel := "n/a (not a CPU mechanism)"
	if o.HasKernel {
		kernel = fmt.Sprintf("%s = mechanism %s at the last audit, %s = %s at the fullest audit, %d audits; %s after close",
			fmtBytes(o.KernelBeforeEnd), fmtBytes(o.UsedBeforeEnd), fmtBytes(o.KernelAtPeak), fmtBytes(o.UsedAtPeak), o.KernelChecks, fmtBytes(o.KernelAfter))
	}
	rows := []row{
		{"trace", fmt.Sprintf("%s, %d requests", o.TraceName, o.Requests)},
		{"memory", fmt.Sprintf("%s mechanism, budget %s, granularity %s, weights %s + second model %s, shared prefix %d tokens",
			o.Mechanism, fmtBytes(cfg.Budget), fmtBytes(cfg.Granularity), fmtBytes(cfg.WeightBytes), fmtBytes(cfg.SecondBytes), cfg.PrefixTokens)},
		{"model shape", fmt.Sprintf("%v = %s of KV per token", cfg.Shape, fmtBytes(cfg.Shape.BytesPerToken()))},
		{"requests served", fmt.Sprintf("%d of %d (%d rejected: context larger than the budget)", o.Served, o.Requests, o.Rejected)},
		{"requests preempted", fmt.Sprintf("%d preemptions of %d requests, %d resumed, none dropped; %d steps a request could not grow in", o.Preemptions, o.PreemptedRequests, o.Resumed, o.Stalls)},
		{"concurrent requests", fmt.Sprintf("peak %d, mean %.1f", o.PeakConcurrent, o.MeanConcurrent)},
		{"peak charged vs capacity", fmt.Sprintf("%s of %s (%s); peak in use incl. grants and pending %s", fmtBytes(o.PeakCharged), fmtBytes(o.Capacity), pct(o.PeakCharged, o.Capacity), fmtBytes(o.PeakInUse))},
		{"pressure", fmt.Sprintf("%d pressure events, %d tickets issued, %s reclaimed by holders", o.PressureEvents, o.Tickets, fmtBytes(o.Reclaimed))},
		{"offloads / reloads", fmt.Sprintf("%d / %d (second model)", o.Offloads, o.Reloads)},
		{"deferred frees", fmt.Sprintf("%d releases freed behind fences", o.DeferredFrees)},
		{"ledger identity", fmt.Sprintf("checked %d times (every step, every authority), %d failures", o.Checks, o.Failures)},
		{"kernel-confirmed bytes", kernel},
		{"data read back", fmt.Sprintf("%d read-backs of KV, prefix and weight bytes", o.DataChecks)},
		{"leaked handles", fmt.Sprintf("%d", o.Leaks)},
		{"process memory", fmt.Sprintf("resident %s before, peak %s, %s after close; goroutines %d before, %d after",
			fmtBytes(o.RSSBefore), fmtBytes(o.RSSPeak), fmtBytes(o.RSSAfter), o.GoroutinesBefore, o.GoroutinesAfter)},
		{"simulated", fmt.Sprintf("%s, %d decode steps, %.0f tokens/s", o.SimTime.Round(time.Millisecond), o.Steps, o.Throughput())},
		{"wall time", o.Wall.Round(time.Millisecond).String()},
	}
	if static != nil {
		rows = append(rows,
			row{"static baseline", "each request reserves prompt + generated tokens at admission (same trace, budget, step model)"},
			row{"  concurrent (peak)", fmt.Sprintf("memgen %d vs static %d: %s", o.PeakConcurrent, static.PeakConcurrent, ratio(float64(o.PeakConcurrent), float64(static.PeakConcurrent)))},
			row{"  concurrent (mean)", fmt.Sprintf("memgen %.1f vs static %.1f: %s", o.MeanConcurrent, static.MeanConcurrent, ratio(o.MeanConcurrent, static.MeanConcurrent))},
			row{"  peak KV bytes", fmt.Sprintf("memgen %s vs static %s: %s", fmtBytes(o.PeakKVBytes), fmtBytes(static.PeakKVBytes), ratio(float64(o.PeakKVBytes), float64(static.PeakKVBytes)))},
			row{"  throughput", fmt.Sprintf("memgen %.0f vs static %.0f tokens/s: %s", o.Throughput(), static.Throughput(), ratio(o.Throughput(), static.Throughput()))},
			row{"  makespan", fmt.Sprintf("memgen %s vs static %s: %s", o.SimTime.Round(time.Millisecond), static.SimTime.Round(time.Millisecond), ratio(static.SimTime.Seconds(), o.SimTime.Seconds()))},
			row{"  served / rejected", fmt.Sprintf("memgen %d / %d, static %d / %d", o.Served, o.Rejected, static.Served, static.Rejected)},
		)
	}
	if o.Failures > 0 {
		for _, f := range o.FailureLog {
			rows = append(rows, row{"FAILURE", f})
		}
	}
	return rows
}

// writeSummary prints rows as a two-column table.
func writeSummary(w io.Writer, rows []row) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r.key))
	}
	fmt.Fprintf(w, "%s\n", strings.Repeat("-", width+2+60))
	for _, r := range rows {
		fmt.Fprintf(w, "%-*s  %s\n", width, r.key, r.value)
	}
	fmt.Fprintf(w, "%s\n", strings.Repeat("-", width+2+60))
}
