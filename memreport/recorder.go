package memreport

import (
	"encoding/json"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
)

// Defaults of Options.
const (
	DefaultMaxPoints = 1200
	DefaultMaxEvents = 400
)

// Options configure a Recorder. The zero value is ready to use.
type Options struct {
	// Title heads the report; "" means "memgen memory report".
	Title string
	// TimeLabel names the time axis; "" means "time (s)".
	TimeLabel string
	// MaxPoints bounds the samples kept per authority (0: DefaultMaxPoints,
	// at least 4).
	MaxPoints int
	// MaxEvents bounds the event markers kept per authority (0:
	// DefaultMaxEvents). Every event is still counted.
	MaxEvents int
}

// Recorder collects governor snapshots and events and writes the report.
// Its methods are safe for concurrent use; Event can be the governor's
// Options.OnEvent hook directly.
type Recorder struct {
	opts Options

	mu    sync.Mutex
	start time.Time
	auths map[memapi.AuthorityID]*timeline
	roles map[governor.HolderID]map[string]struct{}
	notes []Note
	final governor.Snapshot
}

// timeline is one authority's kept samples and markers.
type timeline struct {
	points []point
	tail   *point // the latest sample when the stride skipped it
	seen   int    // samples offered
	stride int

	events  []Marker
	estride int
	eseen   int
	counts  map[string]uint64
}

type point struct {
	t                                    time.Time
	capacity, reserved, charged, pending memapi.Bytes
	holders                              map[governor.HolderID]memapi.Bytes
}

// New returns an empty Recorder.
func New(opts Options) *Recorder {
	if opts.Title == "" {
		opts.Title = "memgen memory report"
	}
	if opts.TimeLabel == "" {
		opts.TimeLabel = "time (s)"
	}
	if opts.MaxPoints == 0 {
		opts.MaxPoints = DefaultMaxPoints
	}
	opts.MaxPoints = max(opts.MaxPoints, 4)
	if opts.MaxEvents <= 0 {
		opts.MaxEvents = DefaultMaxEvents
	}
	return &Recorder{
		opts:  opts,
		auths: map[memapi.AuthorityID]*timeline{},
		roles: map[governor.HolderID]map[string]struct{}{},
	}
}

// Label records that holder h works in role (a holder may have several;
// the report lists them all). Roles carried by governor events are learned
// without it.
func (r *Recorder) Label(h governor.HolderID, role string) {
	if role == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.labelLocked(h, role)
}

func (r *Recorder) labelLocked(h governor.HolderID, role string) {
	set := r.roles[h]
	if set == nil {
		set = map[string]struct{}{}
		r.roles[h] = set
	}
	set[role] = struct{}{}
}

// Note adds a row (a figure of the program's own, such as "requests
// served") to the report's summary table, in the order given.
func (r *Recorder) Note(key, value string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, Note{Key: key, Value: value})
}

func (r *Recorder) at(t time.Time) {
	if r.start.IsZero() || t.Before(r.start) {
		r.start = t
	}
}

func (r *Recorder) timeline(id memapi.AuthorityID) *timeline {
	tl := r.auths[id]
	if tl == nil {
		tl = &timeline{stride: 1, estride: 1, counts: map[string]uint64{}}
		r.auths[id] = tl
	}
	return tl
}

// Sample records the ledger of every authority in s at s.Time. The latest
// sample is also the report's final snapshot.
func (r *Recorder) Sample(s governor.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at(s.Time)
	r.final = s
	for _, a := range s.Authorities {
		p := point{t: s.Time, capacity: a.Capacity, reserved: a.Reserved, charged: a.Charged, pending: a.Pending,
			holders: map[governor.HolderID]memapi.Bytes{}}
		for _, h := range s.Holders {
			for _, ha := range h.Authorities {
				if ha.Authority == a.ID {
					p.holders[h.ID] = ha.Charged
				}
			}
		}
		r.timeline(a.ID).add(p, r.opts.MaxPoints)
	}
}

func (tl *timeline) add(p point, maxPoints int) {
	tl.seen++
	if (tl.seen-1)%tl.stride != 0 {
		tl.tail = &p
		return
	}
	tl.tail = nil
	tl.points = append(tl.points, p)
	if len(tl.points) > maxPoints {
		tl.points = halve(tl.points)
		tl.stride *= 2
	}
}

// halve keeps the samples at even positions: with the stride doubled they
// are exactly the samples the new stride would have kept.
func halve[T any](xs []T) []T {
	n := 0
	for i := 0; i < len(xs); i += 2 {
		xs[n] = xs[i]
		n++
	}
	clear(xs[n:])
	return xs[:n]
}

// Event records a governor event: Pressure, OverBudget and GrantExpired
// become markers on their authority's timeline, every kind is counted, and
// the role of a requesting holder is learned.
func (r *Recorder) Event(e governor.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case governor.EventPressure, governor.EventWaiting, governor.EventServed, governor.EventOverBudget, governor.EventGrantExpired:
		if e.Holder != "" && e.Role != "" {
			r.labelLocked(e.Holder, string(e.Role))
		}
	}
	if e.Authority == "" {
		return
	}
	tl := r.timeline(e.Authority)
	tl.counts[e.Kind.String()]++
	switch e.Kind {
	case governor.EventPressure, governor.EventOverBudget, governor.EventGrantExpired:
	default:
		return
	}
	if !e.Time.IsZero() {
		r.at(e.Time)
	}
	tl.eseen++
	if (tl.eseen-1)%tl.estride != 0 {
		return
	}
	tl.events = append(tl.events, Marker{at: e.Time, Kind: e.Kind.String(), Holder: e.Holder, Role: string(e.Role), Bytes: e.Bytes})
	if len(tl.events) > r.opts.MaxEvents {
		tl.events = halve(tl.events)
		tl.estride *= 2
	}
}

// Report is the data of a memory report: what WriteJSON writes and
// WriteHTML draws.
type Report struct {
	Title     string `json:"title"`
	TimeLabel string `json:"time_label"`
	// Start is the time of the first sample or event; every time in the
	// report is in seconds since Start.
	Start       time.Time  `json:"start"`
	Notes       []Note     `json:"notes,omitempty"`
	Authorities []Timeline `json:"authorities"`
	// Final is the latest snapshot sampled.
	Final governor.Snapshot `json:"final"`
}

// Note is one row of the summary table.
type Note struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Timeline is one authority's ledger over time: the kept samples, series
// major. Reserved + Charged + Pending is the stacked total; Charged is also
// split per holder.
type Timeline struct {
	Authority memapi.AuthorityID `json:"authority"`
	Times     []float64          `json:"times"` // seconds since Report.Start
	Capacity  []memapi.Bytes     `json:"capacity"`
	Reserved  []memapi.Bytes     `json:"reserved"`
	Pending   []memapi.Bytes     `json:"pending"`
	Charged   []memapi.Bytes     `json:"charged"`
	// Holders has one series per holder that had an account on the
	// authority, sorted by holder; a holder is 0 before it first appears.
	Holders []Series `json:"holders"`
	// Samples is how many samples were offered; len(Times) were kept.
	Samples int `json:"samples"`
	// Events are the kept markers; EventCounts counts every event by kind.
	Events      []Marker          `json:"events"`
	EventCounts map[string]uint64 `json:"event_counts"`
}

// Series is one holder's charged bytes at each kept sample.
type Series struct {
	Holder  governor.HolderID `json:"holder"`
	Role    string            `json:"role,omitempty"` // its roles, comma separated
	Charged []memapi.Bytes    `json:"charged"`
}

// Marker is one marked event.
type Marker struct {
	at     time.Time
	Time   float64           `json:"time"` // seconds since Report.Start
	Kind   string            `json:"kind"` // "Pressure", "OverBudget" or "GrantExpired"
	Holder governor.HolderID `json:"holder,omitempty"`
	Role   string            `json:"role,omitempty"`
	Bytes  memapi.Bytes      `json:"bytes"` // the shortfall for Pressure, the bytes asked otherwise
}

// Report returns a copy of what was recorded.
func (r *Recorder) Report() Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := Report{
		Title:     r.opts.Title,
		TimeLabel: r.opts.TimeLabel,
		Start:     r.start,
		Notes:     slices.Clone(r.notes),
		Final:     r.final,
	}
	since := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return t.Sub(r.start).Seconds()
	}
	for _, id := range slices.Sorted(maps.Keys(r.auths)) {
		tl := r.auths[id]
		pts := slices.Clone(tl.points)
		if tl.tail != nil {
			pts = append(pts, *tl.tail)
		}
		out := Timeline{Authority: id, Samples: tl.seen, EventCounts: maps.Clone(tl.counts)}
		holders := map[governor.HolderID]struct{}{}
		for _, p := range pts {
			out.Times = append(out.Times, since(p.t))
			out.Capacity = append(out.Capacity, p.capacity)
			out.Reserved = append(out.Reserved, p.reserved)
			out.Pending = append(out.Pending, p.pending)
			out.Charged = append(out.Charged, p.charged)
			for h := range p.holders {
				holders[h] = struct{}{}
			}
		}
		for _, h := range slices.Sorted(maps.Keys(holders)) {
			s := Series{Holder: h, Role: r.roleLocked(h), Charged: make([]memapi.Bytes, len(pts))}
			for i, p := range pts {
				s.Charged[i] = p.holders[h]
			}
			out.Holders = append(out.Holders, s)
		}
		for _, e := range tl.events {
			e.Time = since(e.at)
			out.Events = append(out.Events, e)
		}
		rep.Authorities = append(rep.Authorities, out)
	}
	return rep
}

func (r *Recorder) roleLocked(h governor.HolderID) string {
	return strings.Join(slices.Sorted(maps.Keys(r.roles[h])), ", ")
}

// WriteJSON writes the report as indented JSON.
func (r *Recorder) WriteJSON(w io.Writer) error { return r.Report().WriteJSON(w) }

// WriteHTML writes the report as a self-contained HTML page.
func (r *Recorder) WriteHTML(w io.Writer) error { return r.Report().WriteHTML(w) }

// WriteJSON writes the report as indented JSON.
func (rep Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// Holder returns the series of holder h on the timeline, if any.
func (tl Timeline) Holder(h governor.HolderID) (Series, bool) {
	i := slices.IndexFunc(tl.Holders, func(s Series) bool { return s.Holder == h })
	if i < 0 {
		return Series{}, false
	}
	return tl.Holders[i], true
}

// peak returns the largest stacked total and capacity of the timeline.
func (tl Timeline) peak() memapi.Bytes {
	var m memapi.Bytes
	for i := range tl.Times {
		m = max(m, tl.Capacity[i], tl.Reserved[i]+tl.Charged[i]+tl.Pending[i])
	}
	return m
}
