package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memreport"
)

// summaryWidth is the width the summary fits in: an 80-column terminal.
const summaryWidth = 80

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

func fmtDuration(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

func fmtLatency(d time.Duration) string { return memreport.FormatDuration(d) }

// summaryRows builds the summary of a run.
func summaryRows(cfg Config, o *Outcome) []row {
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
		{"KV utilisation", fmt.Sprintf("%.1f%% mean, %.1f%% at the KV peak of %s (token-state bytes / KV bytes committed)", 100*o.KVUtilMean, 100*o.KVUtilAtPeak, fmtBytes(o.PeakKVBytes))},
		{"peak charged", fmt.Sprintf("%s of %s (%s); peak in use incl. grants and pending %s", fmtBytes(o.PeakCharged), fmtBytes(o.Capacity), pct(o.PeakCharged, o.Capacity), fmtBytes(o.PeakInUse))},
		{"pressure", fmt.Sprintf("%d pressure events, %d tickets issued, %s reclaimed by holders", o.PressureEvents, o.Tickets, fmtBytes(o.Reclaimed))},
		{"offloads / reloads", fmt.Sprintf("%d / %d (second model)", o.Offloads, o.Reloads)},
		poolRow(o),
		cachesFirstRow(o),
		{"deferred frees", fmt.Sprintf("%d releases freed behind fences", o.DeferredFrees)},
		{"ledger identity", fmt.Sprintf("%d failures in %d checks (every step, every authority)", o.Failures, o.Checks)},
		{"kernel-confirmed bytes", kernel},
		{"data read back", fmt.Sprintf("%d read-backs of KV, prefix and weight bytes", o.DataChecks)},
		{"leaked handles", fmt.Sprintf("%d", o.Leaks)},
		{"process memory", fmt.Sprintf("resident %s before, peak %s, %s after close; goroutines %d before, %d after",
			fmtBytes(o.RSSBefore), fmtBytes(o.RSSPeak), fmtBytes(o.RSSAfter), o.GoroutinesBefore, o.GoroutinesAfter)},
		{"simulated", fmt.Sprintf("%s, %d decode steps, %.0f tokens/s", fmtDuration(o.SimTime), o.Steps, o.Throughput())},
		{"wall time", o.Wall.Round(time.Millisecond).String()},
	}
	rows = slices.DeleteFunc(rows, func(r row) bool { return r.key == "" })
	for _, f := range o.FailureLog {
		rows = append(rows, row{"FAILURE", f})
	}
	return rows
}

// check is one pass/fail check of a run: the report's verdict lists them,
// and the exit status is 1 when any fails.
type check struct {
	label  string
	passed bool
	text   string
}

// runChecks are the checks a run must pass.
func runChecks(o *Outcome) []check {
	return []check{
		{"ledger identity", o.Failures == 0, fmt.Sprintf("%d failures in %d audits (the governor's figures equal the mechanism's, every step, every authority)", o.Failures, o.Checks)},
		{"every request answered", o.Served+o.Rejected == o.Requests, fmt.Sprintf("%d served and %d rejected (context larger than the budget) of %d", o.Served, o.Rejected, o.Requests)},
		{"no leaked handles", o.Leaks == 0, fmt.Sprintf("%d handles open after close", o.Leaks)},
	}
}

// poolRow is the activation workspace's line: what its pool held and
// used at its peaks, and what its cache gave back under pressure.
func poolRow(o *Outcome) row {
	if o.PoolSteps == 0 {
		return row{}
	}
	p := o.Pool
	return row{"activations", fmt.Sprintf("pool over its own binding, %d steps: peak held %s, peak in use %s (fragmentation %.2f: peak held / peak requested); %s of cache given back under pressure in %d reclaims, regrown %d times; Alloc %s",
		o.PoolSteps, fmtBytes(p.PeakSegments), fmtBytes(p.PeakInUse), p.PeakFragmentation(), fmtBytes(p.Reclaimed), p.Reclaims, p.SegmentAllocs, latencyText(o.PoolLatency))}
}

// latencyText says the pool's Alloc latencies (wall clock: they vary with
// the machine's load).
func latencyText(l latencies) string {
	return fmt.Sprintf("p50 %s, p99 %s, p99.9 %s, max %s over %d calls (wall clock)", fmtLatency(l.P50), fmtLatency(l.P99), fmtLatency(l.P999), fmtLatency(l.Max), l.N)
}

// cachesFirstRow says how the device's pressure rounds went: the pool's
// cache asked first, and how often it answered alone.
func cachesFirstRow(o *Outcome) row {
	if o.PoolSteps == 0 {
		return row{}
	}
	f := o.PoolPressure
	return row{"caches first", fmt.Sprintf("%d of %d device pressure rounds asked the activation pool first (%d answered by its cache alone), %d while it held nothing asked others, %d needed no ticket; %d asked another holder first or evicted what its idle cache covered",
		f.PoolFirst, f.Rounds, f.PoolAlone, f.PoolEmpty, f.NoTicket, f.Violations)}
}

// comparisonTable is the comparison for the report, drawn at its top:
// every system's figures, memgen's first, and memgen's ratio to each
// baseline (memgen ÷ baseline, as in the summary).
func comparisonTable(o *Outcome, systems []System) memreport.Table {
	t := memreport.Table{Key: "comparison", Title: "memgen against the baselines",
		Caption: "Same trace, step model and KV budget (the baselines get the budget less the served model's weights; memgen also holds the second model and its activations). KV util = token-state bytes / KV bytes reserved or committed. " + ratioHeader + ".",
		Columns: []string{"system", "peak concurrent", "mean concurrent", "tokens/s", "makespan", "KV peak", "KV util mean", "KV util at peak", "served / rejected",
			"memgen ÷ it: peak", "mean", "throughput", "makespan"}}
	all := append([]System{{Name: "memgen", Figures: o.Figures}}, systems...)
	for i, s := range all {
		r := []string{s.Name, fmt.Sprint(s.PeakConcurrent), fmt.Sprintf("%.1f", s.MeanConcurrent), fmt.Sprintf("%.0f", s.Throughput()), fmtDuration(s.SimTime),
			fmtBytes(s.PeakKVBytes), fmt.Sprintf("%.1f%%", 100*s.KVUtilMean), fmt.Sprintf("%.1f%%", 100*s.KVUtilAtPeak), fmt.Sprintf("%d / %d", s.Served, s.Rejected)}
		if i > 0 {
			r = append(r, ratio(float64(o.PeakConcurrent), float64(s.PeakConcurrent)), ratio(o.MeanConcurrent, s.MeanConcurrent),
				ratio(o.Throughput(), s.Throughput()), ratio(o.SimTime.Seconds(), s.SimTime.Seconds()))
		}
		t.Rows = append(t.Rows, r)
	}
	return t
}

// poolTable is the activation pool's figures for the report: how much it
// held per byte asked (fragmentation) and how long its Allocs took.
func poolTable(o *Outcome) memreport.Table {
	p, l := o.Pool, o.PoolLatency
	return memreport.Table{Key: "activation_pool", Title: "The activation pool",
		Caption: "Fragmentation is bytes held from the binding over bytes requested by blocks in use (1 is none). Latencies are the wall time of pool.Alloc, the slow ones waiting for the governor to free room: they vary with the machine's load.",
		Columns: []string{"figure", "value"},
		Rows: [][]string{
			{"steps", fmt.Sprint(o.PoolSteps)},
			{"peak held / peak requested (fragmentation)", fmt.Sprintf("%s / %s = %.2f", fmtBytes(p.PeakSegments), fmtBytes(p.PeakRequested), p.PeakFragmentation())},
			{"peak in use (rounded blocks)", fmtBytes(p.PeakInUse)},
			{"Alloc calls", fmt.Sprint(l.N)},
			{"Alloc latency p50 / p99 / p99.9", fmt.Sprintf("%s / %s / %s", fmtLatency(l.P50), fmtLatency(l.P99), fmtLatency(l.P999))},
			{"Alloc latency max", fmtLatency(l.Max)},
			{"cache given back under pressure", fmt.Sprintf("%s in %d reclaims", fmtBytes(p.Reclaimed), p.Reclaims)},
			{"regrowths (segments allocated)", fmt.Sprint(p.SegmentAllocs)},
		}}
}

// ratioHeader says which way every ratio of the comparison reads.
const ratioHeader = "memgen ÷ baseline, every ratio: above 1 memgen's figure is the higher (for makespan, below 1 memgen is faster)"

// writeSummary prints rows as a two-column table that fits summaryWidth
// columns, long values wrapped at spaces, then the comparison of memgen
// with the baselines when there are any.
func writeSummary(w io.Writer, rows []row, o *Outcome, systems []System) {
	width := 0
	for _, r := range rows {
		width = max(width, len(r.key))
	}
	rule := strings.Repeat("-", summaryWidth)
	fmt.Fprintln(w, rule)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range rows {
		for i, line := range wrap(r.value, summaryWidth-width-2) {
			key := r.key
			if i > 0 {
				key = ""
			}
			fmt.Fprintf(tw, "%s\t%s\n", key, line)
		}
	}
	_ = tw.Flush()
	if len(systems) > 0 {
		fmt.Fprintln(w, rule)
		writeComparison(w, o, systems)
	}
	fmt.Fprintln(w, rule)
}

// writeComparison prints every system's figures, memgen's first, and then
// memgen's ratio to each baseline, figure by figure: memgen ÷ baseline for
// all of them. Both tables fit summaryWidth columns whatever the figures
// (a makespan up to 999 hours, a KV peak up to 1023.99 GiB).
func writeComparison(w io.Writer, o *Outcome, systems []System) {
	note := "Same trace, step model and KV budget: the baselines get the budget less the served model's weights (no second model); memgen also holds the second model. KV util = token-state bytes / KV bytes reserved or committed."
	if o.PoolSteps > 0 {
		note = "Same trace, step model and KV budget: the baselines get the budget less the served model's weights (no second model, no activations); memgen also holds the second model and its activation pool. KV util = token-state bytes / KV bytes reserved or committed."
	}
	for _, line := range wrap(note, summaryWidth) {
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	const figures = "%-13s%6s%7s%9s%11s%12s%11s%11s\n" // 80 columns
	fmt.Fprintf(w, figures, "system", "peak", "mean", "tokens/s", "makespan", "KV peak", "util mean", "util@peak")
	all := append([]System{{Name: "memgen", Figures: o.Figures}}, systems...)
	for _, s := range all {
		fmt.Fprintf(w, figures, s.Name, fmt.Sprint(s.PeakConcurrent), fmt.Sprintf("%.1f", s.MeanConcurrent), fmt.Sprintf("%.0f", s.Throughput()),
			clock(s.SimTime), fmtBytes(s.PeakKVBytes), fmt.Sprintf("%.1f%%", 100*s.KVUtilMean), fmt.Sprintf("%.1f%%", 100*s.KVUtilAtPeak))
	}
	fmt.Fprintln(w)
	for _, line := range wrap(ratioHeader+":", summaryWidth) {
		fmt.Fprintln(w, line)
	}
	const ratios = "%-13s%11s%11s%11s%11s%19s\n" // 76 columns
	fmt.Fprintf(w, ratios, "vs", "peak conc.", "mean conc.", "throughput", "makespan", "served / rejected")
	for _, s := range systems {
		fmt.Fprintf(w, ratios, s.Name,
			ratio(float64(o.PeakConcurrent), float64(s.PeakConcurrent)), ratio(o.MeanConcurrent, s.MeanConcurrent),
			ratio(o.Throughput(), s.Throughput()), ratio(o.SimTime.Seconds(), s.SimTime.Seconds()), fmt.Sprintf("%d / %d", s.Served, s.Rejected))
	}
}

// clock writes a duration as h:mm:ss.s, at most 10 characters below 1,000
// hours.
func clock(d time.Duration) string {
	d = d.Round(100 * time.Millisecond)
	h := d / time.Hour
	m := (d % time.Hour) / time.Minute
	s := float64(d%time.Minute) / float64(time.Second)
	return fmt.Sprintf("%d:%02d:%04.1f", h, m, s)
}

// wrap cuts s into lines of at most width bytes at spaces (a word longer
// than width gets a line of its own).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	return append(lines, line)
}
