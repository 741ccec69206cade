package memreport

import (
	"encoding/json"
	"io"
	"math"
	"slices"
	"strconv"
)

// traceEvent is one event of the Chrome trace-event format, which
// ui.perfetto.dev and chrome://tracing open: a counter ("C"), an instant
// ("i"), a complete span ("X") or metadata ("M"). Times are microseconds.
type traceEvent struct {
	Name     string         `json:"name"`
	Category string         `json:"cat,omitempty"`
	Phase    string         `json:"ph"`
	Time     float64        `json:"ts"`
	Duration *float64       `json:"dur,omitempty"`
	PID      int            `json:"pid"`
	TID      int            `json:"tid"`
	Scope    string         `json:"s,omitempty"`
	Args     map[string]any `json:"args,omitempty"`
}

// Trace is a trace-event file in the JSON object form: what
// Recorder.WriteTrace writes, and what a program decodes it into.
type Trace struct {
	TraceEvents     []traceEvent `json:"traceEvents"`
	DisplayTimeUnit string       `json:"displayTimeUnit"`
}

// trace returns the report as trace events (see Recorder.WriteTrace).
func (rep Report) trace() Trace {
	us := func(s float64) float64 { return math.Round(s*1e9) / 1e3 }
	tr := Trace{TraceEvents: []traceEvent{}, DisplayTimeUnit: "ms"}
	add := func(e traceEvent) { tr.TraceEvents = append(tr.TraceEvents, e) }
	meta := func(name string, pid, tid int, value string) {
		add(traceEvent{Name: name, Phase: "M", PID: pid, TID: tid, Args: map[string]any{"name": value}})
	}
	for i, tl := range rep.Authorities {
		pid := i + 1
		meta("process_name", pid, 0, "authority "+string(tl.Authority))
		meta("thread_name", pid, 0, "events")
		for k, t := range tl.Times {
			free := int64(tl.Capacity[k]) - int64(tl.Reserved[k]+tl.Charged[k]+tl.Pending[k])
			add(traceEvent{Name: "ledger", Category: "memory", Phase: "C", Time: us(t), PID: pid,
				Args: map[string]any{"reserved": tl.Reserved[k], "charged": tl.Charged[k], "pending": tl.Pending[k], "free": max(free, 0)}})
			for _, h := range tl.Holders {
				add(traceEvent{Name: "holder " + string(h.Holder), Category: "memory", Phase: "C", Time: us(t), PID: pid,
					Args: map[string]any{"in_use": h.InUse[k], "cached": h.Cached[k], "quarantined": h.Quarantined[k]}}) // stacked: the charge
			}
		}
		for _, e := range tl.Events {
			args := map[string]any{"holder": e.Holder, "bytes": e.Bytes}
			if e.Kind == "ticket" {
				args = map[string]any{"holder": e.Holder, "ticket": e.Ticket, "wanted": e.Bytes, "freed": e.Freed, "answered": e.Answered,
					"answer_seconds": e.AnswerSeconds, "answer_wall_seconds": e.AnswerWallSeconds}
			}
			if e.Detail != "" {
				args["detail"] = e.Detail
			}
			if e.Error != "" {
				args["error"] = e.Error
			}
			add(traceEvent{Name: e.Kind + " " + e.Holder, Category: e.Kind, Phase: "i", Scope: "p", Time: us(e.Time), PID: pid, Args: args})
		}
	}
	if len(rep.Spans) > 0 {
		pid := len(rep.Authorities) + 1
		meta("process_name", pid, 0, "spans")
		spans := slices.Clone(rep.Spans)
		slices.SortStableFunc(spans, func(a, b span) int {
			switch {
			case a.Start < b.Start:
				return -1
			case a.Start > b.Start:
				return 1
			}
			return 0
		})
		var laneEnd []float64
		for _, s := range spans {
			lane := slices.IndexFunc(laneEnd, func(end float64) bool { return end <= s.Start })
			if lane < 0 {
				lane = len(laneEnd)
				laneEnd = append(laneEnd, 0)
				meta("thread_name", pid, lane+1, "lane "+strconv.Itoa(lane+1))
			}
			laneEnd[lane] = max(s.End, s.Start)
			d := us(max(s.End-s.Start, 0))
			add(traceEvent{Name: s.Name, Category: s.Category, Phase: "X", Time: us(s.Start), Duration: &d, PID: pid, TID: lane + 1})
		}
	}
	return tr
}

// writeTrace writes the report as a Chrome trace-event JSON file.
func (rep Report) writeTrace(w io.Writer) error { return json.NewEncoder(w).Encode(rep.trace()) }

// WriteTrace writes the report as a Chrome trace-event JSON file (a
// Trace): one process per authority with a counter track of its ledger
// (reserved, charged, pending, free) and one of each holder's charged
// bytes, the authority's events as instants (a ticket's args carry the
// holder asked, the bytes wanted and freed, and its time to answer), and,
// in a last process, the program's spans, each on the first lane (thread)
// free at its start so spans never overlap on a lane.
func (r *Recorder) WriteTrace(w io.Writer) error { return r.Report().writeTrace(w) }
