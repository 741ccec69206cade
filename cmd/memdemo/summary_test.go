package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The comparison fits 80 columns whatever the figures (the full trace's
// static-max runs for hours), and every ratio is memgen ÷ baseline, the
// makespan's included: against a baseline that takes twice as long memgen's
// makespan reads 0.50x.
func TestComparisonFits80ColumnsAndReadsOneWay(t *testing.T) {
	o := &Outcome{Figures: Figures{PeakConcurrent: 9999, MeanConcurrent: 999.9, Tokens: 100 * 3600 * 99999, SimTime: 100 * time.Hour,
		PeakKVBytes: 1023<<30 + 1000<<20, KVUtilMean: 1, KVUtilAtPeak: 1, Served: 99999}, PoolSteps: 1}
	slow := System{Name: "static-oracle", Figures: Figures{PeakConcurrent: 1, MeanConcurrent: 0.5, Tokens: 100, SimTime: 999*time.Hour + 59*time.Minute + 59*time.Second,
		PeakKVBytes: 1023<<30 + 1000<<20, KVUtilMean: 0.001, KVUtilAtPeak: 0.5, Served: 99999, Rejected: 99999}}
	half := System{Name: "paged", Figures: Figures{PeakConcurrent: 10, MeanConcurrent: 10, Tokens: 2 * o.Tokens, SimTime: 200 * time.Hour}}
	var b bytes.Buffer
	writeComparison(&b, o, []System{slow, half})
	out := b.String()
	for _, line := range strings.Split(out, "\n") {
		require.LessOrEqual(t, len([]rune(line)), summaryWidth, "line %q", line)
	}
	require.Contains(t, out, "999:59:59.0")
	require.Contains(t, out, "memgen ÷ baseline, every ratio")
	var paged string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "paged ") && strings.HasSuffix(line, " / 0") {
			paged = line
		}
	}
	f := strings.Fields(paged)
	require.Len(t, f, 8, "paged's ratio line %q", paged)
	// memgen's makespan is half paged's (100 h against 200 h): memgen ÷
	// paged is 0.50x; paged made twice the tokens in twice the time, so the
	// throughputs are level: 1.00x.
	require.Equal(t, "0.50x", f[4], "makespan ratio in %q", paged)
	require.Equal(t, "1.00x", f[3], "throughput ratio in %q", paged)
}
