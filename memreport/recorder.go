package memreport

import (
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
	defaultMaxPoints = 1200
	defaultMaxEvents = 5000
	defaultMaxSpans  = 100000
)

// Options configure a Recorder. The zero value is ready to use.
type Options struct {
	// Title heads the report; "" means "memgen memory report".
	Title string
	// TimeLabel names the time axis; "" means "time (s)".
	TimeLabel string
	// MaxPoints bounds the samples kept per authority (0: 1200,
	// at least 4).
	MaxPoints int
	// MaxEvents bounds the events kept per authority (0: 5000). Every event
	// is still counted.
	MaxEvents int
	// MaxSpans bounds the spans kept for the trace export (0: 100000);
	// later spans are counted and dropped.
	MaxSpans int
	// WallClock times the holders' answers to tickets in wall-clock time
	// (nil: time.Now); the report's own times come from the snapshots and
	// events, which may be simulated.
	WallClock func() time.Time
}

// Recorder collects governor snapshots, events and spans and writes the
// report. Its methods are safe for concurrent use; Event can be the
// governor's Options.OnEvent hook directly.
type Recorder struct {
	opts Options

	mu      sync.Mutex
	start   time.Time
	auths   map[memapi.AuthorityID]*authorityLog
	roles   map[governor.HolderID]map[string]struct{}
	notes   []note
	checks  []check
	tables  []Table
	data    map[string]any
	latest  governor.Snapshot
	end     *governor.Snapshot
	spans   []timedSpan
	dropped int // spans over MaxSpans
}

// authorityLog is one authority's kept samples, exact per-holder figures and
// kept events.
type authorityLog struct {
	points []point
	tail   *point // the latest sample when the stride skipped it
	seen   int    // samples offered
	stride int

	first, last time.Time // of the samples offered
	stats       map[governor.HolderID]*holderStat

	events  []*keptEvent
	estride int
	eseen   int
	tickets map[uint64]*keptEvent // tickets asked whose answer has not come
	counts  map[string]uint64
}

type point struct {
	t                                    time.Time
	capacity, reserved, charged, pending memapi.Bytes
	holders                              map[governor.HolderID]holderPoint
}

// holderPoint is one holder's charge at a sample, and the parts of it that
// are cache and quarantined.
type holderPoint struct {
	charged, cached, quarantined memapi.Bytes
}

// inUse is the part of the charge that holds data (0 for a hand-made
// snapshot whose parts exceed its charge).
func (p holderPoint) inUse() memapi.Bytes {
	if p.cached+p.quarantined > p.charged {
		return 0
	}
	return p.charged - p.cached - p.quarantined
}

// holderStat is one holder's charge on an authority over every sample
// offered, not only the kept ones.
type holderStat struct {
	peak       memapi.Bytes
	peakCached memapi.Bytes
	last       holderPoint
	lastT      time.Time
	byteSec    float64 // the integral of the charge over time
}

// keptEvent is a kept event with the times its JSON form is computed from.
type keptEvent struct {
	event
	at, asked, answered time.Time
	wallAsked           time.Time
}

// timedSpan is a span as recorded, before the report puts it in seconds.
type timedSpan struct {
	name, category string
	start, end     time.Time
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
		opts.MaxPoints = defaultMaxPoints
	}
	opts.MaxPoints = max(opts.MaxPoints, 4)
	if opts.MaxEvents <= 0 {
		opts.MaxEvents = defaultMaxEvents
	}
	if opts.MaxSpans <= 0 {
		opts.MaxSpans = defaultMaxSpans
	}
	if opts.WallClock == nil {
		opts.WallClock = time.Now
	}
	return &Recorder{
		opts:  opts,
		auths: map[memapi.AuthorityID]*authorityLog{},
		roles: map[governor.HolderID]map[string]struct{}{},
		data:  map[string]any{},
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
// served") to the report's summary table, in the order given. Its JSON key
// is label in snake_case.
func (r *Recorder) Note(label, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, note{Key: snakeCase(label), Label: label, Text: text})
}

// Check adds one of the program's pass/fail checks, in the order given:
// the page opens with the verdict (every check passed, or which failed)
// and lists them after the program's tables. Its JSON key is label in
// snake_case.
func (r *Recorder) Check(label string, passed bool, text string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks = append(r.checks, check{Key: snakeCase(label), Label: label, Passed: passed, Text: text})
}

// Table adds a table of the program's own, drawn at the top of the
// report, in the order given. Its Key is made snake_case; a row with
// fewer cells than Columns is padded with empty ones, and nil lists become
// empty ones, so the snapshot holds no null.
func (r *Recorder) Table(t Table) {
	t.Key = snakeCase(t.Key)
	t.Columns = append([]string{}, t.Columns...)
	rows := make([][]string, 0, len(t.Rows))
	for _, row := range t.Rows {
		out := append([]string{}, row...)
		for len(out) < len(t.Columns) {
			out = append(out, "")
		}
		rows = append(rows, out)
	}
	t.Rows = rows
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tables = append(r.tables, t)
}

// Data attaches v, which must marshal to a JSON object with snake_case
// keys and numbers as numbers, to the JSON snapshot under data.key: the
// program's own figures in a form tools can read.
func (r *Recorder) Data(key string, v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.data[key] = v
}

// End records s as the ledger at the end of the work: the report's ledger
// tables and its per-holder final bytes show it rather than the latest
// sample. A program that closes its memory system afterwards still
// samples the closed state on the chart, but the tables keep the figures
// of the work.
func (r *Recorder) End(s governor.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.end = &s
}

// Span records an interval of the program's work, such as a request from
// admission to finish, for the trace-event export.
func (r *Recorder) Span(name, category string, start, end time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.spans) >= r.opts.MaxSpans {
		r.dropped++
		return
	}
	r.at(start)
	r.spans = append(r.spans, timedSpan{name: name, category: category, start: start, end: end})
}

func (r *Recorder) at(t time.Time) {
	if t.IsZero() {
		return
	}
	if r.start.IsZero() || t.Before(r.start) {
		r.start = t
	}
}

func (r *Recorder) timeline(id memapi.AuthorityID) *authorityLog {
	tl := r.auths[id]
	if tl == nil {
		tl = &authorityLog{stride: 1, estride: 1, counts: map[string]uint64{}, stats: map[governor.HolderID]*holderStat{}, tickets: map[uint64]*keptEvent{}}
		for _, k := range governorKinds {
			tl.counts[k] = 0
		}
		r.auths[id] = tl
	}
	return tl
}

// Sample records the ledger of every authority in s at s.Time.
func (r *Recorder) Sample(s governor.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at(s.Time)
	r.latest = s
	for _, a := range s.Authorities {
		p := point{t: s.Time, capacity: a.Capacity, reserved: a.Reserved, charged: a.Charged, pending: a.Pending,
			holders: map[governor.HolderID]holderPoint{}}
		for _, h := range s.Holders {
			for _, ha := range h.Authorities {
				if ha.Authority == a.ID {
					p.holders[h.ID] = holderPoint{charged: ha.Charged, cached: ha.Cached, quarantined: ha.Quarantined}
				}
			}
		}
		tl := r.timeline(a.ID)
		tl.stat(p)
		tl.add(p, r.opts.MaxPoints)
	}
}

// stat folds p into the exact per-holder figures: a holder's charge holds
// from one sample to the next.
func (tl *authorityLog) stat(p point) {
	if tl.seen == 0 {
		tl.first = p.t
	}
	tl.last = p.t
	for h := range tl.stats {
		if _, ok := p.holders[h]; !ok {
			p.holders[h] = holderPoint{} // an account closed: 0 from now on
		}
	}
	for h, v := range p.holders {
		st := tl.stats[h]
		if st == nil {
			st = &holderStat{lastT: p.t}
			tl.stats[h] = st
		}
		st.byteSec += float64(st.last.charged) * p.t.Sub(st.lastT).Seconds()
		st.last, st.lastT = v, p.t
		st.peak = max(st.peak, v.charged)
		st.peakCached = max(st.peakCached, v.cached)
	}
}

func (tl *authorityLog) add(p point, maxPoints int) {
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

// halve keeps the elements at even positions: with the stride doubled they
// are exactly the elements the new stride would have kept.
func halve[T any](xs []T) []T {
	n := 0
	for i := 0; i < len(xs); i += 2 {
		xs[n] = xs[i]
		n++
	}
	clear(xs[n:])
	return xs[:n]
}

// governorKinds are the JSON names of the governor's event kinds (each
// kind's value is its name); every authority counts each of them, from 0.
var governorKinds = []string{
	governor.EventPressure, governor.EventTicket, governor.EventReclaimed, governor.EventWaiting,
	governor.EventServed, governor.EventOverBudget, governor.EventGrantExpired, governor.EventCapacity,
}

// Event records a governor event on its authority's timeline. Every kind
// is counted and kept (up to Options.MaxEvents per authority, evenly
// thinned beyond); a Reclaimed event completes the entry of the ticket it
// answers (the bytes freed and the time to answer) rather than adding one,
// and the role of a requesting holder is learned.
func (r *Recorder) Event(e governor.Event) {
	wall := r.opts.WallClock()
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
	r.at(e.Time)
	tl := r.timeline(e.Authority)
	kind := e.Kind
	tl.counts[kind]++
	if e.Kind == governor.EventReclaimed {
		if t := tl.tickets[e.Ticket.ID]; t != nil {
			delete(tl.tickets, e.Ticket.ID)
			t.Answered = true
			t.Freed = e.Bytes
			t.answered = e.Time
			t.AnswerWallSeconds = wall.Sub(t.wallAsked).Seconds()
			if e.Err != nil {
				t.Error = e.Err.Error()
			}
		}
		return
	}
	ev := &keptEvent{at: e.Time, event: event{Kind: kind, Holder: string(e.Holder), Role: string(e.Role), Bytes: e.Bytes}}
	switch e.Kind {
	case governor.EventTicket:
		ev.Ticket = e.Ticket.ID
		ev.Bytes = e.Ticket.Wanted
		ev.asked, ev.wallAsked = e.Time, wall
		tl.tickets[e.Ticket.ID] = ev
	case governor.EventGrantExpired:
		ev.Detail = "drawn " + FormatBytes(e.Drawn)
	}
	if e.Err != nil {
		ev.Error = e.Err.Error()
	}
	tl.keep(ev, r.opts.MaxEvents)
}

// Annotation is an event of the program's own, such as an offload or a
// preemption, for the report's events table and chart.
type Annotation struct {
	Time      time.Time
	Authority memapi.AuthorityID
	Kind      string // snake_case: "offload", "preemption"
	Holder    governor.HolderID
	Bytes     memapi.Bytes
	Detail    string
}

// Annotate records a of the program's own on its authority's timeline,
// counted and kept like a governor event.
func (r *Recorder) Annotate(a Annotation) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at(a.Time)
	tl := r.timeline(a.Authority)
	kind := snakeCase(a.Kind)
	tl.counts[kind]++
	tl.keep(&keptEvent{at: a.Time, event: event{Kind: kind, Holder: string(a.Holder), Role: r.roleLocked(a.Holder), Bytes: a.Bytes, Detail: a.Detail}}, r.opts.MaxEvents)
}

func (tl *authorityLog) keep(ev *keptEvent, maxEvents int) {
	tl.eseen++
	if (tl.eseen-1)%tl.estride != 0 {
		return
	}
	tl.events = append(tl.events, ev)
	if len(tl.events) > maxEvents {
		tl.events = halve(tl.events)
		tl.estride *= 2
	}
}

// snakeCase returns s in lower case with every run of other characters
// than letters and digits turned into one underscore: "Peak charged vs
// capacity" is peak_charged_vs_capacity.
func snakeCase(s string) string {
	var b strings.Builder
	under := false
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		default:
			under = b.Len() > 0
			continue
		}
		if under {
			b.WriteByte('_')
			under = false
		}
		b.WriteRune(c)
	}
	return b.String()
}

func (r *Recorder) roleLocked(h governor.HolderID) string {
	return strings.Join(slices.Sorted(maps.Keys(r.roles[h])), ", ")
}
