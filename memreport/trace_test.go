package memreport

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// traceFile is the trace-event file as a generic JSON reader sees it.
type traceFile struct {
	TraceEvents     []map[string]any `json:"traceEvents"`
	DisplayTimeUnit string           `json:"displayTimeUnit"`
}

// CheckTrace validates the structure of a Chrome trace-event file as the
// viewers read it, and returns its events by phase.
func checkTrace(t *testing.T, b []byte) map[string][]map[string]any {
	t.Helper()
	var f traceFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&f), "the JSON object form: traceEvents and displayTimeUnit")
	require.Contains(t, []string{"ms", "ns"}, f.DisplayTimeUnit)
	require.NotEmpty(t, f.TraceEvents)
	byPhase := map[string][]map[string]any{}
	type lane struct{ pid, tid float64 }
	lastEnd := map[lane]float64{}
	for i, e := range f.TraceEvents {
		name, ok := e["name"].(string)
		require.True(t, ok && name != "", "event %d has a name: %v", i, e)
		ph, _ := e["ph"].(string)
		require.Contains(t, []string{"C", "i", "X", "M"}, ph, "event %d phase", i)
		pid, ok1 := e["pid"].(float64)
		tid, ok2 := e["tid"].(float64)
		require.True(t, ok1 && ok2 && pid >= 1 && tid >= 0 && pid == float64(int(pid)) && tid == float64(int(tid)), "event %d has integer pid and tid: %v", i, e)
		args, _ := e["args"].(map[string]any)
		switch ph {
		case "M":
			require.Contains(t, []string{"process_name", "thread_name"}, name)
			_, ok := args["name"].(string)
			require.True(t, ok, "metadata %d names its process or thread", i)
		default:
			ts, ok := e["ts"].(float64)
			require.True(t, ok && ts >= 0, "event %d has a time in µs: %v", i, e)
		}
		switch ph {
		case "C":
			require.NotEmpty(t, args, "counter %d has values", i)
			for k, v := range args {
				_, ok := v.(float64)
				require.True(t, ok, "counter %d's %s is a number: %v", i, k, v)
			}
		case "i":
			require.Equal(t, "p", e["s"], "instant %d is process-scoped", i)
		case "X":
			d, ok := e["dur"].(float64)
			require.True(t, ok && d >= 0, "span %d has a duration: %v", i, e)
			ts := e["ts"].(float64)
			l := lane{pid, tid}
			require.GreaterOrEqual(t, ts, lastEnd[l], "span %d does not overlap the previous one on its lane", i)
			lastEnd[l] = ts + d
		}
		byPhase[ph] = append(byPhase[ph], e)
	}
	return byPhase
}

func TestTraceEventExport(t *testing.T) {
	rec, snaps := fullScenario(t)
	var buf bytes.Buffer
	require.NoError(t, rec.WriteTrace(&buf))
	ev := checkTrace(t, buf.Bytes())
	rep := rec.Report()

	// Counters: per authority, its ledger at every kept sample; per holder
	// on it, its charge.
	counters := map[string]int{}
	for _, e := range ev["C"] {
		counters[e["name"].(string)+"@"+itoa(e["pid"].(float64))]++
	}
	for i, tl := range rep.Authorities {
		pid := float64(i + 1)
		require.Equal(t, len(tl.Times), counters["ledger@"+itoa(pid)], "%s ledger counter", tl.Authority)
		for _, h := range tl.Holders {
			require.Equal(t, len(tl.Times), counters["holder "+string(h.Holder)+"@"+itoa(pid)], "%s on %s", h.Holder, tl.Authority)
		}
	}
	// The first device counter is the first sample's ledger.
	for _, e := range ev["C"] {
		if e["name"] == "ledger" && e["pid"].(float64) == 1 {
			a := authorityOf(t, snaps[0], "dev")
			args := e["args"].(map[string]any)
			require.Equal(t, float64(a.Charged), args["charged"])
			require.Equal(t, float64(a.Free), args["free"])
			break
		}
	}
	// Instants: every kept event; the ticket carries what the table shows.
	require.Len(t, ev["i"], len(rep.Authorities[0].Events)+len(rep.Authorities[1].Events))
	var ticket map[string]any
	for _, e := range ev["i"] {
		if e["cat"] == "ticket" {
			ticket = e["args"].(map[string]any)
		}
	}
	require.NotNil(t, ticket)
	require.Equal(t, "kv", ticket["holder"])
	require.Equal(t, float64(10*mib), ticket["freed"])
	require.Equal(t, true, ticket["answered"])
	// Spans: the three requests, on two lanes (2 and 3 do not overlap; 1
	// overlaps both).
	require.Len(t, ev["X"], 3)
	lanes := map[float64]bool{}
	for _, e := range ev["X"] {
		lanes[e["tid"].(float64)] = true
		require.Equal(t, "request", e["cat"])
	}
	require.Len(t, lanes, 2)
}

func itoa(f float64) string { b, _ := json.Marshal(f); return string(b) }
