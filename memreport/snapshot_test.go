package memreport

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/governor"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// fullScenario is scenario with everything a program adds: notes, data,
// annotations, spans and the end of the work marked before a close.
func fullScenario(t *testing.T) (*Recorder, []governor.Snapshot) {
	rec, snaps := scenario(t)
	last := snaps[len(snaps)-1]
	rec.Note("Requests served", "42 of 42")
	rec.Check("Ledger identity", true, "0 failures in 12 checks")
	rec.Table(Table{Key: "Comparison", Title: "memgen against the baselines", Caption: "memgen ÷ baseline",
		Columns: []string{"system", "peak", "memgen ÷ it"}, Rows: [][]string{{"paged", "3", "1.02x"}, {"static-max", "1"}}})
	rec.Data("run", map[string]any{"requests": 42, "kv_util_mean": 0.97, "systems": []any{map[string]any{"name": "paged", "peak_concurrent": 3}}})
	rec.Annotate(Annotation{Time: last.Time, Authority: "dev", Kind: "offload", Holder: "weights", Bytes: 8 * mib, Detail: "to the host"})
	rec.Annotate(Annotation{Time: last.Time, Authority: "dev", Kind: "preemption", Holder: "kv", Bytes: mib})
	rec.Span("request 1", "request", snaps[0].Time, last.Time)
	rec.Span("request 2", "request", snaps[1].Time, snaps[2].Time)
	rec.Span("request 3", "request", snaps[2].Time, last.Time)
	rec.End(last)
	// The close: every account back to 0, sampled a second later.
	closed := governor.Snapshot{Time: last.Time.Add(time.Second)}
	for _, a := range last.Authorities {
		closed.Authorities = append(closed.Authorities, governor.AuthoritySnapshot{ID: a.ID, Capacity: a.Capacity, Free: a.Capacity, Granted: a.Granted, Tickets: a.Tickets})
	}
	rec.Sample(closed)
	return rec, snaps
}

func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	sch, err := jsonschema.NewCompiler().Compile("report.schema.json")
	require.NoError(t, err, "the schema compiles")
	return sch
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	require.NoError(t, err)
	return v
}

func TestJSONSnapshotMatchesItsSchema(t *testing.T) {
	sch := compileSchema(t)
	rec, _ := fullScenario(t)
	var buf bytes.Buffer
	require.NoError(t, rec.WriteJSON(&buf))
	require.NoError(t, sch.Validate(decode(t, buf.Bytes())), buf.String())

	// An empty recorder's snapshot conforms too: lists empty, not null.
	buf.Reset()
	require.NoError(t, New(Options{}).WriteJSON(&buf))
	require.NoError(t, sch.Validate(decode(t, buf.Bytes())), buf.String())

	// So does one of samples without events, holders or notes.
	bare := New(Options{})
	bare.Sample(governor.Snapshot{Time: time.Unix(5, 0), Authorities: []governor.AuthoritySnapshot{{ID: "a", Capacity: 10, Free: 10}}})
	buf.Reset()
	require.NoError(t, bare.WriteJSON(&buf))
	require.NoError(t, sch.Validate(decode(t, buf.Bytes())), buf.String())
	require.NotContains(t, buf.String(), "null")

	// The schema rejects what the old snapshot did.
	for name, edit := range map[string]func(string) string{
		"events null":     func(s string) string { return strings.Replace(s, `"events": [`, `"events": null, "x": [`, 1) },
		"no version":      func(s string) string { return strings.Replace(s, `"version": 5,`, ``, 1) },
		"a Go field name": func(s string) string { return strings.Replace(s, `"capacity": [`, `"Capacity": [`, 1) },
		"a number as prose": func(s string) string {
			return regexp.MustCompile(`"samples": \d+`).ReplaceAllString(s, `"samples": "7"`)
		},
		"a key with spaces": func(s string) string {
			return strings.Replace(s, `"key": "requests_served"`, `"key": "  requests served"`, 1)
		},
		"an unknown version":         func(s string) string { return strings.Replace(s, `"version": 5,`, `"version": 4,`, 1) },
		"a check without its result": func(s string) string { return strings.Replace(s, `"passed": true,`, ``, 1) },
		"a holder without its split": func(s string) string {
			return regexp.MustCompile(`"in_use": \d+,`).ReplaceAllString(s, ``)
		},
	} {
		var b bytes.Buffer
		require.NoError(t, rec.WriteJSON(&b))
		bad := edit(b.String())
		require.NotEqual(t, b.String(), bad, name)
		require.Error(t, sch.Validate(decode(t, []byte(bad))), name)
	}
}

func TestJSONSnapshotSnakeCaseNoNulls(t *testing.T) {
	rec, _ := fullScenario(t)
	var buf bytes.Buffer
	require.NoError(t, rec.WriteJSON(&buf))
	var v any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &v))
	snake := regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case nil:
			t.Errorf("%s is null", path)
		case map[string]any:
			for k, e := range x {
				require.Regexp(t, snake, k, "key at %s", path)
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(path+"["+string(rune('0'+i%10))+"]", e)
			}
		}
	}
	walk("$", v)
	// Every kind the run produced is listed, not only pressure.
	rep := rec.Report()
	kinds := map[string]bool{}
	for _, e := range rep.Authorities[0].Events {
		kinds[e.Kind] = true
	}
	for _, k := range []string{"capacity", "pressure", "ticket", "offload", "preemption"} {
		require.True(t, kinds[k], "events of kind %s are kept", k)
	}
}

func TestHolderStatsAndTheEndOfTheWork(t *testing.T) {
	rec, snaps := fullScenario(t)
	rep := rec.Report()
	dev := rep.Authorities[0]
	require.True(t, rep.Ledger.Marked)
	last := snaps[len(snaps)-1]
	require.InDelta(t, last.Time.Sub(rep.Start).Seconds(), rep.Ledger.Time, 1e-9, "the ledger is the marked one, not the closed state")
	stat := func(h governor.HolderID) HolderStats {
		for _, s := range dev.HolderStats {
			if s.Holder == h {
				return s
			}
		}
		t.Fatalf("no stats for %s", h)
		return HolderStats{}
	}
	// weights on dev, one sample a second (then the close): 0, 40, 40, 40,
	// 80 MiB, then 0. Peak 80 MiB; mean over the 5 s from the first sample
	// to the close, each value holding until the next sample:
	// (0+40+40+40+80)/5 = 40 MiB; at the end of the work 80 MiB, although
	// the last sample (after the close) is 0.
	w := stat("weights")
	require.Equal(t, 80*mib, w.Peak)
	require.InDelta(t, float64(40*mib), w.Mean, 1)
	require.Equal(t, 80*mib, w.Final)
	// kv: 0, 0, 30, 26 (4 MiB marked pending), 16 MiB (a 10 MiB lease
	// released to the ticket), then 0: peak 30, mean (0+0+30+26+16)/5 =
	// 14.4 MiB, final 16 MiB.
	kv := stat("kv")
	require.Equal(t, 30*mib, kv.Peak)
	require.InDelta(t, 14.4*float64(mib), kv.Mean, 1)
	require.Equal(t, holderCharged(last, "kv", "dev"), kv.Final)
	require.Equal(t, 16*mib, kv.Final)

	// The page's ledger and holder tables say the same, not the closed state.
	var buf bytes.Buffer
	require.NoError(t, rec.WriteHTML(&buf))
	page := buf.String()
	require.Contains(t, page, "Ledger at the end of the work")
	require.Contains(t, page, `<tr data-holder="weights" data-peak="83886080" data-final="83886080" data-in-use="83886080" data-cached="0" data-quarantined="0">`)
	require.Contains(t, page, `<tr data-holder="weights" data-charged="83886080" data-in-use="83886080" data-cached="0" data-quarantined="0">`)
	require.NotContains(t, page, `<th>peak cached</th>`, "no split columns where no holder had a cache or quarantined bytes")
}

func TestTicketWallTimeToAnswer(t *testing.T) {
	wall := time.Unix(0, 0)
	rec := New(Options{WallClock: func() time.Time { return wall }})
	at := time.Unix(100, 0)
	rec.Event(governor.Event{Kind: governor.EventTicket, Time: at, Authority: "a", Holder: "kv", Ticket: governor.Ticket{ID: 7, Wanted: 5 * mib}})
	wall = wall.Add(3 * time.Millisecond)
	rec.Event(governor.Event{Kind: governor.EventReclaimed, Time: at.Add(time.Second), Authority: "a", Holder: "kv", Bytes: 6 * mib, Ticket: governor.Ticket{ID: 7, Wanted: 5 * mib}})
	ev := rec.Report().Authorities[0].Events
	require.Len(t, ev, 1)
	require.Equal(t, event{Kind: "ticket", Holder: "kv", Bytes: 5 * mib, Ticket: 7, Answered: true, Freed: 6 * mib, AnswerSeconds: 1, AnswerWallSeconds: 0.003}, ev[0])
}

func TestSnakeCase(t *testing.T) {
	for in, want := range map[string]string{
		"Peak charged vs capacity": "peak_charged_vs_capacity",
		"  concurrent (peak)":      "concurrent_peak",
		"offloads / reloads":       "offloads_reloads",
		"KV utilisation":           "kv_utilisation",
		"OverBudget":               "overbudget",
		"static-oracle":            "static_oracle",
	} {
		require.Equal(t, want, snakeCase(in), in)
	}
}

func TestSpansAreBounded(t *testing.T) {
	rec := New(Options{MaxSpans: 2})
	at := time.Unix(0, 0)
	for range 5 {
		rec.Span("r", "request", at, at.Add(time.Second))
	}
	rep := rec.Report()
	require.Len(t, rep.Spans, 2)
	require.Equal(t, 3, rep.SpansDropped)
}
