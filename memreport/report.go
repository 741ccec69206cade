package memreport

import (
	"encoding/json"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// version is the version of the JSON snapshot's layout, its "version"
// field; report.schema.json describes it. Version 3 split each holder's
// charge into in use, cached and quarantined bytes; version 4 added the
// program's tables (Tables); version 5 its checks (Checks).
const version = 5

// Report is the data of a memory report: what Recorder.WriteJSON writes
// (and a program decodes the file into) and Recorder.WriteHTML draws. Every
// key of its JSON form is snake_case, every figure a number, every list a
// list (empty, never null).
type Report struct {
	Version   int    `json:"version"`
	Title     string `json:"title"`
	TimeLabel string `json:"time_label"`
	// Start is the time of the first sample, event or span; every time in
	// the report is in seconds since Start.
	Start time.Time `json:"start"`
	Notes []note    `json:"notes"`
	// Checks are the program's pass/fail checks (Recorder.Check): the
	// page's verdict, at its top.
	Checks []check `json:"checks"`
	// Tables are the program's own tables (Recorder.Table), drawn at the
	// top of the page, before the charts.
	Tables []Table `json:"tables"`
	// Data are the program's own figures (Recorder.Data).
	Data        map[string]any `json:"data"`
	Authorities []timeline     `json:"authorities"`
	// Ledger is the ledger at the end of the work (Recorder.End), or the
	// latest sample when the program marked none.
	Ledger ledger `json:"ledger"`
	// Spans are the program's intervals (Recorder.Span); SpansDropped
	// counts those over Options.MaxSpans.
	Spans        []span `json:"spans"`
	SpansDropped int    `json:"spans_dropped"`
}

// Table is a table of the program's own: a comparison with baselines, an
// allocator's figures. The page draws every table at its top, in the order
// recorded, before the charts.
type Table struct {
	Key     string     `json:"key"`     // snake_case, unique in the report
	Title   string     `json:"title"`   // its heading
	Caption string     `json:"caption"` // how to read it (units, which way a ratio reads); may be empty
	Columns []string   `json:"columns"` // the header; the first column labels the rows
	Rows    [][]string `json:"rows"`    // each as many cells as Columns
}

// check is one of the program's pass/fail checks, such as "the ledger
// equals the mechanism at every audit".
type check struct {
	Key    string `json:"key"`   // the label in snake_case
	Label  string `json:"label"` // as the page shows it
	Passed bool   `json:"passed"`
	Text   string `json:"text"` // what was checked and found
}

// note is one row of the summary table.
type note struct {
	Key   string `json:"key"`   // the label in snake_case
	Label string `json:"label"` // as the table shows it
	Text  string `json:"text"`
}

// timeline is one authority's ledger over time: the kept samples, series
// major. Reserved + Charged + Pending is the stacked total; Charged is also
// split per holder.
type timeline struct {
	Authority memapi.AuthorityID `json:"authority"`
	Times     []float64          `json:"times"` // seconds since Report.Start
	Capacity  []memapi.Bytes     `json:"capacity"`
	Reserved  []memapi.Bytes     `json:"reserved"`
	Pending   []memapi.Bytes     `json:"pending"`
	Charged   []memapi.Bytes     `json:"charged"`
	// Holders has one series per holder that had an account on the
	// authority, sorted by holder; a holder is 0 before it first appears.
	Holders []series `json:"holders"`
	// Samples is how many samples were offered; len(Times) were kept.
	Samples int `json:"samples"`
	// HolderStats has each holder's peak, mean and final charge over every
	// sample offered, in the order of Holders.
	HolderStats []HolderStats `json:"holder_stats"`
	// Events are the kept events, in time order; EventsSeen counts every
	// event recorded and EventCounts counts them by kind.
	Events      []event           `json:"events"`
	EventsSeen  int               `json:"events_seen"`
	EventCounts map[string]uint64 `json:"event_counts"`
}

// series is one holder's charged bytes at each kept sample, and their
// split: Charged = InUse + Cached + Quarantined at every sample. Cached is
// what the holder reports as cache (governor.CacheReporter: a pool's free
// and pending blocks), 0 for holders that report none.
type series struct {
	Holder      governor.HolderID `json:"holder"`
	Role        string            `json:"role"` // its roles, comma separated
	Charged     []memapi.Bytes    `json:"charged"`
	InUse       []memapi.Bytes    `json:"in_use"`
	Cached      []memapi.Bytes    `json:"cached"`
	Quarantined []memapi.Bytes    `json:"quarantined"`
}

// HolderStats are one holder's figures on an authority over every sample
// offered: the most it was charged, its charge averaged over time (each
// sample's charge holding until the next), and its charge in the ledger;
// the most of it that was cache, and the ledger's split of the final
// charge into in use, cached and quarantined bytes.
type HolderStats struct {
	Holder           governor.HolderID `json:"holder"`
	Role             string            `json:"role"`
	Peak             memapi.Bytes      `json:"peak"`
	Mean             float64           `json:"mean"`
	Final            memapi.Bytes      `json:"final"`
	PeakCached       memapi.Bytes      `json:"peak_cached"`
	FinalInUse       memapi.Bytes      `json:"final_in_use"`
	FinalCached      memapi.Bytes      `json:"final_cached"`
	FinalQuarantined memapi.Bytes      `json:"final_quarantined"`
}

// event is one kept event: a governor event (kind pressure, ticket,
// waiting, served, over_budget, grant_expired, capacity) or one of the
// program's annotations (offload, preemption, ...).
type event struct {
	Time float64 `json:"time"` // seconds since Report.Start
	Kind string  `json:"kind"`
	// Holder is the requester (pressure, waiting, served, over_budget),
	// the holder asked (ticket) or the one the program names.
	Holder string `json:"holder"`
	Role   string `json:"role"`
	// Bytes is what the event is about: the bytes wanted (ticket, waiting,
	// served, over_budget), the shortfall (pressure), the capacity, the
	// bytes offloaded or preempted.
	Bytes memapi.Bytes `json:"bytes"`
	// For a ticket: whether the holder answered, the bytes it freed, and
	// its time to answer in the report's time and in wall-clock time.
	Ticket            uint64       `json:"ticket"`
	Answered          bool         `json:"answered"`
	Freed             memapi.Bytes `json:"freed"`
	AnswerSeconds     float64      `json:"answer_seconds"`
	AnswerWallSeconds float64      `json:"answer_wall_seconds"`
	Error             string       `json:"error"`
	Detail            string       `json:"detail"`
}

// ledger is the governor's ledger at one time, in the report's names.
type ledger struct {
	Time float64 `json:"time"` // seconds since Report.Start
	// Marked says the program marked it as the end of its work
	// (Recorder.End); otherwise it is the latest sample.
	Marked      bool              `json:"marked"`
	Authorities []ledgerAuthority `json:"authorities"`
	Holders     []ledgerHolder    `json:"holders"`
}

// ledgerAuthority is one authority's ledger and its counters so far.
type ledgerAuthority struct {
	Authority      memapi.AuthorityID `json:"authority"`
	Capacity       memapi.Bytes       `json:"capacity"`
	Reserved       memapi.Bytes       `json:"reserved"`
	Charged        memapi.Bytes       `json:"charged"`
	Cached         memapi.Bytes       `json:"cached"`      // of Charged: its holders' cache
	Quarantined    memapi.Bytes       `json:"quarantined"` // of Charged: frees that failed, waiting for a retry
	Pending        memapi.Bytes       `json:"pending"`
	Free           memapi.Bytes       `json:"free"`
	Balanced       bool               `json:"balanced"`
	Granted        uint64             `json:"granted"`
	Waited         uint64             `json:"waited"`
	OverBudget     uint64             `json:"over_budget"`
	Tickets        uint64             `json:"tickets"`
	Reclaimed      memapi.Bytes       `json:"reclaimed"`
	PressureEvents uint64             `json:"pressure_events"`
}

// ledgerHolder is one holder's account on one authority. Charged = InUse
// + Cached + Quarantined.
type ledgerHolder struct {
	Holder      governor.HolderID  `json:"holder"`
	Authority   memapi.AuthorityID `json:"authority"`
	Priority    int                `json:"priority"`
	Charged     memapi.Bytes       `json:"charged"`
	InUse       memapi.Bytes       `json:"in_use"`      // data: neither cache nor quarantined
	Cached      memapi.Bytes       `json:"cached"`      // held for reuse, given back without evicting data
	Quarantined memapi.Bytes       `json:"quarantined"` // frees that failed, still held
	Pending     memapi.Bytes       `json:"pending"`
	Reserved    memapi.Bytes       `json:"reserved"`
	Tickets     uint64             `json:"tickets"`
	Reclaimed   memapi.Bytes       `json:"reclaimed"`
}

// span is one interval of the program's work.
type span struct {
	Name     string  `json:"name"`
	Category string  `json:"category"`
	Start    float64 `json:"start"` // seconds since Report.Start
	End      float64 `json:"end"`
}

// Report returns a copy of what was recorded.
func (r *Recorder) Report() Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := Report{
		Version:      version,
		Title:        r.opts.Title,
		TimeLabel:    r.opts.TimeLabel,
		Start:        r.start,
		Notes:        append([]note{}, r.notes...),
		Checks:       append([]check{}, r.checks...),
		Tables:       append([]Table{}, r.tables...),
		Data:         maps.Clone(r.data),
		Authorities:  []timeline{},
		Spans:        []span{},
		SpansDropped: r.dropped,
	}
	since := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return t.Sub(r.start).Seconds()
	}
	ledger := r.latest
	if r.end != nil {
		ledger = *r.end
	}
	rep.Ledger = ledgerOf(ledger, since(ledger.Time), r.end != nil)
	for _, id := range slices.Sorted(maps.Keys(r.auths)) {
		tl := r.auths[id]
		pts := slices.Clone(tl.points)
		if tl.tail != nil {
			pts = append(pts, *tl.tail)
		}
		out := timeline{Authority: id, Samples: tl.seen, EventCounts: maps.Clone(tl.counts), EventsSeen: tl.eseen,
			Times: []float64{}, Capacity: []memapi.Bytes{}, Reserved: []memapi.Bytes{}, Pending: []memapi.Bytes{}, Charged: []memapi.Bytes{},
			Holders: []series{}, HolderStats: []HolderStats{}, Events: []event{}}
		for _, p := range pts {
			out.Times = append(out.Times, since(p.t))
			out.Capacity = append(out.Capacity, p.capacity)
			out.Reserved = append(out.Reserved, p.reserved)
			out.Pending = append(out.Pending, p.pending)
			out.Charged = append(out.Charged, p.charged)
		}
		span := tl.last.Sub(tl.first).Seconds()
		for _, h := range slices.Sorted(maps.Keys(tl.stats)) {
			n := len(pts)
			s := series{Holder: h, Role: r.roleLocked(h), Charged: make([]memapi.Bytes, n), InUse: make([]memapi.Bytes, n),
				Cached: make([]memapi.Bytes, n), Quarantined: make([]memapi.Bytes, n)}
			for i, p := range pts {
				v := p.holders[h]
				s.Charged[i], s.Cached[i], s.Quarantined[i] = v.charged, v.cached, v.quarantined
				s.InUse[i] = v.inUse()
			}
			out.Holders = append(out.Holders, s)
			st := tl.stats[h]
			last := st.last
			hs := HolderStats{Holder: h, Role: s.Role, Peak: st.peak, Mean: float64(last.charged), PeakCached: st.peakCached}
			if span > 0 {
				hs.Mean = st.byteSec / span
			}
			if i := slices.IndexFunc(rep.Ledger.Holders, func(l ledgerHolder) bool { return l.Holder == h && l.Authority == id }); i >= 0 {
				l := rep.Ledger.Holders[i]
				last = holderPoint{charged: l.Charged, cached: l.Cached, quarantined: l.Quarantined}
			} else if r.end != nil {
				last = holderPoint{}
			}
			hs.Final, hs.FinalCached, hs.FinalQuarantined = last.charged, last.cached, last.quarantined
			hs.FinalInUse = last.inUse()
			out.HolderStats = append(out.HolderStats, hs)
		}
		for _, e := range tl.events {
			ev := e.event
			ev.Time = since(e.at)
			if ev.Answered && !e.answered.IsZero() {
				ev.AnswerSeconds = e.answered.Sub(e.asked).Seconds()
			}
			out.Events = append(out.Events, ev)
		}
		slices.SortStableFunc(out.Events, func(a, b event) int {
			switch {
			case a.Time < b.Time:
				return -1
			case a.Time > b.Time:
				return 1
			}
			return 0
		})
		rep.Authorities = append(rep.Authorities, out)
	}
	for _, s := range r.spans {
		rep.Spans = append(rep.Spans, span{Name: s.name, Category: s.category, Start: since(s.start), End: since(s.end)})
	}
	return rep
}

func ledgerOf(s governor.Snapshot, t float64, marked bool) ledger {
	l := ledger{Time: t, Marked: marked, Authorities: []ledgerAuthority{}, Holders: []ledgerHolder{}}
	for _, a := range s.Authorities {
		l.Authorities = append(l.Authorities, ledgerAuthority{Authority: a.ID, Capacity: a.Capacity, Reserved: a.Reserved, Charged: a.Charged,
			Cached: a.Cached, Quarantined: a.Quarantined, Pending: a.Pending, Free: a.Free, Balanced: a.Balanced(), Granted: a.Granted, Waited: a.Waited, OverBudget: a.OverBudget,
			Tickets: a.Tickets, Reclaimed: a.Freed, PressureEvents: a.PressureEvents})
	}
	for _, h := range s.Holders {
		for _, ha := range h.Authorities {
			l.Holders = append(l.Holders, ledgerHolder{Holder: h.ID, Authority: ha.Authority, Priority: int(h.Priority), Charged: ha.Charged,
				InUse: ha.InUse(), Cached: ha.Cached, Quarantined: ha.Quarantined, Pending: ha.Pending, Reserved: ha.Reserved, Tickets: ha.Tickets, Reclaimed: ha.Freed})
		}
	}
	return l
}

// WriteJSON writes the report as indented JSON.
func (r *Recorder) WriteJSON(w io.Writer) error { return r.Report().writeJSON(w) }

// WriteHTML writes the report as a self-contained HTML page (XHTML syntax,
// so it is well-formed XML; no external scripts, styles or fonts): the
// verdict of the program's checks, its tables (a comparison with
// baselines), the checks one by one, the holder toggles and zoom
// controls, per authority a chart of the ledger over time with a cursor
// readout, the per-holder peak, mean and final bytes and the events table,
// then the summary notes and the ledger at the end of the work. The charts
// are drawn in Go and redrawn by the page's script at the window's width,
// over the zoomed time window, with the holders switched on.
func (r *Recorder) WriteHTML(w io.Writer) error { return r.Report().writeHTML(w) }

// writeJSON writes the report as indented JSON.
func (rep Report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// Holder returns the series of holder h on the timeline, if any.
func (tl timeline) Holder(h governor.HolderID) (series, bool) {
	i := slices.IndexFunc(tl.Holders, func(s series) bool { return s.Holder == h })
	if i < 0 {
		return series{}, false
	}
	return tl.Holders[i], true
}

// peak returns the largest stacked total and capacity of the timeline.
func (tl timeline) peak() memapi.Bytes {
	var m memapi.Bytes
	for i := range tl.Times {
		m = max(m, tl.Capacity[i], tl.Reserved[i]+tl.Charged[i]+tl.Pending[i])
	}
	return m
}
