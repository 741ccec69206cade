package memreport

import (
	"bufio"
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/bytesize"
)

// Chart geometry, in SVG user units.
const (
	chartW   = 1240
	chartH   = 440
	padLeft  = 84
	padRight = 250
	padTop   = 28
	padBot   = 56
	plotW    = chartW - padLeft - padRight
	plotH    = chartH - padTop - padBot
)

// palette colours holder layers in order; pending and reserved have their own.
var palette = []string{"#4e79a7", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac", "#86bcb6"}

const (
	pendingColour  = "#e15759"
	reservedColour = "#d4d4d4"
	pressureColour = "#c0392b"
)

const style = `body{font-family:sans-serif;margin:16px 2vw;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}.verdict{font-size:16px;font-weight:bold;margin:4px 0 8px;padding:4px 8px;display:inline-block}
.verdict.pass{background:#e3f1e3;color:#1d5e20}.verdict.fail{background:#fbe3e1;color:#8a1c12}
td.pass{color:#1d5e20;font-weight:bold}td.fail{color:#8a1c12;font-weight:bold}h2{font-size:18px;margin:28px 0 6px}h3{font-size:15px;margin:14px 0 4px}
p.sub{color:#555;margin:0 0 12px;font-size:13px;max-width:75em}
table{border-collapse:collapse;font-size:13px;margin:6px 0 12px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f2f2f2;position:sticky;top:0}td.k,th.k{text-align:left}
.scroll{max-height:320px;overflow:auto;border:1px solid #ddd;display:inline-block;max-width:100%}
.scroll table{margin:0}table.events td{white-space:nowrap}
.wide{overflow-x:auto;max-width:100%}
tr.out{display:none}tr.hit td{background:#fff3c4}
table.events tr[data-time]{cursor:pointer}table.events tr[data-time]:hover td{background:#eef4fb}
.toggles{display:flex;flex-wrap:wrap;gap:4px 16px;font-size:13px;margin:8px 0}
.toggles label{white-space:nowrap;cursor:pointer}
.sw{display:inline-block;width:12px;height:12px;margin:0 4px -1px 2px;border-radius:2px}
.controls{font-size:13px;margin:6px 0}.controls button{font-size:13px;margin-right:4px}
.controls,.toggles,.readout{display:none}body.live .controls,body.live .toggles{display:flex;flex-wrap:wrap;align-items:center;gap:4px}
body.live .readout{display:block}
.readout{font-size:13px;color:#333;min-height:2.6em;margin:2px 0 8px;font-variant-numeric:tabular-nums}
.chart{width:100%}.chart svg{display:block;max-width:100%;height:auto}
svg text{font-family:sans-serif;font-size:12px;fill:#333}
svg .axis{stroke:#555;stroke-width:1}svg .grid{stroke:#e6e6e6;stroke-width:1}
svg .cap{fill:none;stroke:#111;stroke-width:2;stroke-dasharray:7 4}
svg .mark{stroke-width:1.5;opacity:.7;cursor:pointer}
svg .cursor{stroke:#000;stroke-width:1;stroke-dasharray:3 3}svg .sel{fill:#4e79a7;opacity:.15}`

// script is the page's interactive chart (zoom, pan, cursor readout,
// holder toggles, events table links); the page works without it, with
// the static charts drawn in Go.
//
//go:embed report.js
var script string

// writeHTML writes the report as Recorder.WriteHTML says.
func (rep Report) writeHTML(w io.Writer) error {
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p("<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n")
	p("<title>%s</title>\n<style>%s</style>\n</head>\n<body>\n", esc(rep.Title), style)
	p("<h1>%s</h1>\n", esc(rep.Title))
	writeVerdict(bw, rep)
	writeTables(bw, rep)
	writeChecks(bw, rep)
	if !rep.Start.IsZero() {
		p("<p class=\"sub\">Times are seconds since %s. Stacked areas: each holder's charged bytes (the steadiest at the bottom; the part a holder reports as cache, such as a caching pool's free blocks, paler above the bytes it uses), then the bytes pending free (released, waiting for device fences) and the bytes reserved by open grants; the dashed line is the capacity; ticks above the plot mark events (red: pressure, orange: tickets, purple: offloads, blue: reloads, brown: preemptions), listed with the routine ones (reservations waiting and served) in each authority's events table; click a tick or a row to find the other.</p>\n",
			esc(rep.Start.UTC().Format("2006-01-02 15:04:05.000 UTC")))
	}
	colours := holderColours(rep)
	writeControls(bw, rep, colours)
	for _, tl := range rep.Authorities {
		p("<section class=\"authority\" data-authority=\"%s\">\n<h2>Authority %s</h2>\n", esc(string(tl.Authority)), esc(string(tl.Authority)))
		p("<div class=\"chart\" data-authority=\"%s\">\n", esc(string(tl.Authority)))
		writeChart(bw, rep, tl, colours)
		p("</div>\n<div class=\"readout\" data-authority=\"%s\"></div>\n", esc(string(tl.Authority)))
		if len(tl.Times) < tl.Samples {
			p("<p class=\"sub\">%d of %d samples kept (evenly spaced, the last always kept); the holder figures below are over every sample.</p>\n", len(tl.Times), tl.Samples)
		}
		writeHolderStats(bw, rep, tl, colours)
		writeEvents(bw, tl)
		p("</section>\n")
	}
	if len(rep.Notes) > 0 {
		p("<h2>Summary</h2>\n<div class=\"wide\"><table class=\"notes\">\n")
		for _, n := range rep.Notes {
			p("<tr data-key=\"%s\"><td class=\"k\">%s</td><td class=\"k\">%s</td></tr>\n", esc(n.Key), esc(n.Label), esc(n.Text))
		}
		p("</table></div>\n")
	}
	writeLedger(bw, rep)
	if err := writeData(bw, rep, colours); err != nil {
		return err
	}
	p("<script>//<![CDATA[\n%s//]]>\n</script>\n", script)
	p("</body>\n</html>\n")
	return bw.Flush()
}

// writeControls writes the holder toggles (which double as the legend)
// and the zoom controls; the page's script shows them.
func writeControls(w *bufio.Writer, rep Report, colours map[governor.HolderID]string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("<div class=\"toggles\" id=\"holders\">")
	for _, h := range slices.Sorted(maps.Keys(colours)) {
		label := string(h)
		if role := roleOf(rep, h); role != "" {
			label += " (" + role + ")"
		}
		p("<label><input type=\"checkbox\" class=\"toggle\" data-holder=\"%s\" checked=\"checked\"/><span class=\"sw\" style=\"background:%s\"></span>%s</label>", esc(string(h)), colours[h], esc(label))
	}
	p("<label><span class=\"sw\" style=\"background:%s\"></span>pending free</label><label><span class=\"sw\" style=\"background:%s\"></span>reserved (grants)</label></div>\n", pendingColour, reservedColour)
	p("<div class=\"controls\"><button type=\"button\" id=\"zoom-in\">zoom in</button><button type=\"button\" id=\"zoom-out\">zoom out</button><button type=\"button\" id=\"pan-left\">\u2190 pan</button><button type=\"button\" id=\"pan-right\">pan \u2192</button><button type=\"button\" id=\"reset\">reset</button> <span id=\"window\"></span></div>\n")
}

func roleOf(rep Report, h governor.HolderID) string {
	for _, tl := range rep.Authorities {
		if s, ok := tl.Holder(h); ok && s.Role != "" {
			return s.Role
		}
	}
	return ""
}

// writeHolderStats writes the per-holder table of an authority: peak,
// time-weighted mean and final bytes and, where a holder had a cache or
// quarantined bytes, the final bytes split into in use, cached and
// quarantined, and the peak of the cache.
func writeHolderStats(w *bufio.Writer, rep Report, tl timeline, colours map[governor.HolderID]string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	if len(tl.HolderStats) == 0 {
		return
	}
	final := "final"
	if rep.Ledger.Marked {
		final = "at the end of the work"
	}
	// The split columns only where some holder had a cache or quarantined
	// bytes: elsewhere in use is the final charge and the rest is 0.
	split := slices.ContainsFunc(tl.HolderStats, func(s HolderStats) bool {
		return s.PeakCached != 0 || s.FinalCached != 0 || s.FinalQuarantined != 0
	})
	head := ""
	if split {
		head = "<th>of it in use</th><th>cached</th><th>quarantined</th><th>peak cached</th>"
	}
	p("<h3>Holders</h3>\n<div class=\"wide\"><table class=\"holder-stats\" data-authority=\"%s\">\n<thead><tr><th class=\"k\">holder</th><th class=\"k\">role</th><th>peak</th><th>mean</th><th>%s</th>%s</tr></thead><tbody>\n", esc(string(tl.Authority)), esc(final), head)
	for _, s := range tl.HolderStats {
		p("<tr data-holder=\"%s\" data-peak=\"%d\" data-final=\"%d\" data-in-use=\"%d\" data-cached=\"%d\" data-quarantined=\"%d\"><td class=\"k\"><span class=\"sw\" style=\"background:%s\"></span>%s</td><td class=\"k\">%s</td><td>%s</td><td>%s</td><td>%s</td>",
			esc(string(s.Holder)), s.Peak, s.Final, s.FinalInUse, s.FinalCached, s.FinalQuarantined, colours[s.Holder], esc(string(s.Holder)), esc(s.Role),
			FormatBytes(s.Peak), FormatBytes(memapi.Bytes(math.Round(s.Mean))), FormatBytes(s.Final))
		if split {
			p("<td>%s</td><td>%s</td><td>%s</td><td>%s</td>", FormatBytes(s.FinalInUse), FormatBytes(s.FinalCached), FormatBytes(s.FinalQuarantined), FormatBytes(s.PeakCached))
		}
		p("</tr>\n")
	}
	p("</tbody></table></div>\n")
}

// writeEvents writes an authority's events table: every kept event with
// the holder asked or named, the bytes wanted and freed and a ticket's
// time to answer. The page's script links its rows to the chart.
func writeEvents(w *bufio.Writer, tl timeline) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	if len(tl.Events) == 0 {
		return
	}
	var counts []string
	for _, k := range slices.Sorted(maps.Keys(tl.EventCounts)) {
		if tl.EventCounts[k] > 0 {
			counts = append(counts, fmt.Sprintf("%s %d", k, tl.EventCounts[k]))
		}
	}
	p("<h3>Events</h3>\n<p class=\"sub\">%d events recorded (%s); %d kept (evenly thinned beyond the limit). <span class=\"events-count\" data-authority=\"%s\"></span></p>\n",
		tl.EventsSeen, esc(strings.Join(counts, ", ")), len(tl.Events), esc(string(tl.Authority)))
	p("<div class=\"toggles kinds\" data-authority=\"%s\">show:", esc(string(tl.Authority)))
	for _, k := range slices.Sorted(maps.Keys(tl.EventCounts)) {
		if tl.EventCounts[k] == 0 || k == "reclaimed" { // a reclaimed event completes its ticket's row
			continue
		}
		checked := " checked=\"checked\""
		if !marked(k) {
			checked = "" // the routine kinds start hidden
		}
		p("<label><input type=\"checkbox\" class=\"kind\" data-kind=\"%s\"%s/><span class=\"sw\" style=\"background:%s\"></span>%s</label>", esc(k), checked, kindColour(k), esc(k))
	}
	p("</div>\n")
	p("<div class=\"scroll\"><table class=\"events\" data-authority=\"%s\">\n<thead><tr><th>time (s)</th><th class=\"k\">event</th><th class=\"k\">holder</th><th>bytes wanted</th><th>bytes freed</th><th>time to answer</th><th class=\"k\">detail</th></tr></thead><tbody>\n", esc(string(tl.Authority)))
	for i, e := range tl.Events {
		wanted, freed, answer := FormatBytes(e.Bytes), "", ""
		if e.Kind == "ticket" {
			if e.Answered {
				freed = FormatBytes(e.Freed)
				answer = fmt.Sprintf("%s s (%s wall)", strconv.FormatFloat(e.AnswerSeconds, 'f', 3, 64), wallDuration(e.AnswerWallSeconds))
			} else {
				answer = "not answered"
			}
		}
		detail := e.Detail
		if e.Error != "" {
			detail = strings.TrimSpace(detail + " " + e.Error)
		}
		p("<tr data-event=\"%d\" data-time=\"%s\" data-kind=\"%s\" data-holder=\"%s\"><td>%s</td><td class=\"k\">%s</td><td class=\"k\">%s</td><td>%s</td><td>%s</td><td>%s</td><td class=\"k\">%s</td></tr>\n",
			i, strconv.FormatFloat(e.Time, 'f', -1, 64), esc(e.Kind), esc(e.Holder), strconv.FormatFloat(e.Time, 'f', 3, 64), esc(e.Kind), esc(e.Holder), wanted, freed, esc(answer), esc(detail))
	}
	p("</tbody></table></div>\n")
}

func wallDuration(s float64) string { return FormatDuration(time.Duration(s * 1e9)) }

// chartData is what the page's script draws: per authority, the layers in
// stack order with their colours, the capacity and the events.
type chartData struct {
	TimeLabel   string           `json:"time_label"`
	Authorities []chartAuthority `json:"authorities"`
}

type chartAuthority struct {
	Authority memapi.AuthorityID `json:"authority"`
	Times     []float64          `json:"times"`
	Capacity  []memapi.Bytes     `json:"capacity"`
	Layers    []chartLayer       `json:"layers"`
	Events    []chartEvent       `json:"events"`
}

type chartLayer struct {
	Kind    string         `json:"kind"`
	Holder  string         `json:"holder"`
	Label   string         `json:"label"`
	Colour  string         `json:"colour"`
	Opacity float64        `json:"opacity"`
	Values  []memapi.Bytes `json:"values"`
}

type chartEvent struct {
	Index int     `json:"index"` // its row in the events table
	Time  float64 `json:"time"`
	Kind  string  `json:"kind"`
}

// marked says whether events of kind get a mark on the chart: all but the
// routine ones (a reservation waiting and served, a capacity set), which
// only the events table lists.
func marked(kind string) bool {
	switch kind {
	case "waiting", "served", "capacity":
		return false
	}
	return true
}

// writeData embeds the chart data as JSON (json.Marshal escapes <, > and
// &, so the page stays well-formed XML).
func writeData(w *bufio.Writer, rep Report, colours map[governor.HolderID]string) error {
	d := chartData{TimeLabel: rep.TimeLabel, Authorities: []chartAuthority{}}
	for _, tl := range rep.Authorities {
		a := chartAuthority{Authority: tl.Authority, Times: tl.Times, Capacity: tl.Capacity, Layers: []chartLayer{}, Events: []chartEvent{}}
		for _, l := range layers(tl, colours) {
			a.Layers = append(a.Layers, chartLayer{Kind: l.kind, Holder: l.holder, Label: l.label, Colour: l.colour, Opacity: l.opacity(), Values: l.values})
		}
		for i, e := range tl.Events {
			if marked(e.Kind) {
				a.Events = append(a.Events, chartEvent{Index: i, Time: e.Time, Kind: e.Kind})
			}
		}
		d.Authorities = append(d.Authorities, a)
	}
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "<script type=\"application/json\" id=\"memreport-data\">%s</script>\n", b)
	return nil
}

// scale maps the timeline's values into the plot area.
type scale struct {
	tmax float64
	vmax float64
}

func (s scale) x(t float64) float64 { return padLeft + t/s.tmax*plotW }

func (s scale) y(v memapi.Bytes) float64 { return padTop + plotH - float64(v)/s.vmax*plotH }

func newScale(tl timeline) scale {
	s := scale{tmax: 1, vmax: float64(niceCeil(tl.peak()))}
	if n := len(tl.Times); n > 0 && tl.Times[n-1] > 0 {
		s.tmax = tl.Times[n-1]
	}
	for _, e := range tl.Events {
		s.tmax = max(s.tmax, e.Time)
	}
	if s.vmax <= 0 {
		s.vmax = 1
	}
	return s
}

// layer is one stacked area.
type layer struct {
	kind, holder, role, label, colour string
	values                            []memapi.Bytes
}

// opacity is a layer's fill opacity: a holder's cache is paler than the
// bytes it uses.
func (l layer) opacity() float64 {
	if l.kind == "cached" {
		return 0.4
	}
	return 0.9
}

// layers returns the stack bottom to top: holders from the steadiest (the
// least total variation of their charge over the timeline) to the most
// variable, so pinned data forms a flat base, then pending and reserved
// bytes. A holder that had cached bytes at any kept sample is two layers:
// its charge less the cache ("holder"), then the cache ("cached", in its
// colour, paler). colours gives every holder the same colour on every
// chart.
func layers(tl timeline, colours map[governor.HolderID]string) []layer {
	order := make([]int, len(tl.Holders))
	variation := make([]memapi.Bytes, len(tl.Holders))
	for i, h := range tl.Holders {
		order[i] = i
		for k := 1; k < len(h.Charged); k++ {
			a, b := h.Charged[k-1], h.Charged[k]
			variation[i] += max(a, b) - min(a, b)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(variation[a], variation[b]) })
	var ls []layer
	for _, i := range order {
		h := tl.Holders[i]
		label := string(h.Holder)
		if h.Role != "" {
			label += " (" + h.Role + ")"
		}
		if !slices.ContainsFunc(h.Cached, func(v memapi.Bytes) bool { return v != 0 }) {
			ls = append(ls, layer{kind: "holder", holder: string(h.Holder), role: h.Role, label: label,
				colour: colours[h.Holder], values: h.Charged})
			continue
		}
		used := make([]memapi.Bytes, len(h.Charged))
		for k := range used {
			used[k] = h.Charged[k] - min(h.Cached[k], h.Charged[k])
		}
		ls = append(ls,
			layer{kind: "holder", holder: string(h.Holder), role: h.Role, label: label, colour: colours[h.Holder], values: used},
			layer{kind: "cached", holder: string(h.Holder), role: h.Role, label: label + " cached", colour: colours[h.Holder], values: h.Cached})
	}
	ls = append(ls,
		layer{kind: "pending", label: "pending free", colour: pendingColour, values: tl.Pending},
		layer{kind: "reserved", label: "reserved (grants)", colour: reservedColour, values: tl.Reserved})
	return ls
}

// holderColours assigns palette colours to the report's holders in sorted order.
func holderColours(rep Report) map[governor.HolderID]string {
	set := map[governor.HolderID]struct{}{}
	for _, tl := range rep.Authorities {
		for _, h := range tl.Holders {
			set[h.Holder] = struct{}{}
		}
	}
	out := map[governor.HolderID]string{}
	for i, h := range slices.Sorted(maps.Keys(set)) {
		out[h] = palette[i%len(palette)]
	}
	return out
}

func writeChart(w *bufio.Writer, rep Report, tl timeline, colours map[governor.HolderID]string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	s := newScale(tl)
	p("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"timeline\" data-authority=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n",
		esc(string(tl.Authority)), chartW, chartH, chartW, chartH)
	p("<title>ledger of authority %s</title>\n", esc(string(tl.Authority)))
	// Grid and axes.
	for _, v := range ticks(memapi.Bytes(s.vmax)) {
		y := s.y(v)
		p("<line class=\"grid\" x1=\"%d\" y1=\"%s\" x2=\"%d\" y2=\"%s\"/>\n", padLeft, f(y), padLeft+plotW, f(y))
		p("<text x=\"%d\" y=\"%s\" text-anchor=\"end\">%s</text>\n", padLeft-6, f(y+4), esc(FormatBytes(v)))
	}
	for _, t := range timeTicks(s.tmax) {
		x := s.x(t)
		p("<line class=\"axis\" x1=\"%s\" y1=\"%d\" x2=\"%s\" y2=\"%d\"/>\n", f(x), padTop+plotH, f(x), padTop+plotH+5)
		p("<text x=\"%s\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", f(x), padTop+plotH+19, strconv.FormatFloat(t, 'g', 6, 64))
	}
	p("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", padLeft+plotW/2, chartH-10, esc(rep.TimeLabel))
	// Stacked areas, bottom to top.
	ls := layers(tl, colours)
	base := make([]memapi.Bytes, len(tl.Times))
	for _, l := range ls {
		top := make([]memapi.Bytes, len(base))
		for i := range base {
			top[i] = base[i] + l.values[i]
		}
		var pts strings.Builder
		for i, t := range tl.Times {
			fmt.Fprintf(&pts, "%s,%s ", f(s.x(t)), f(s.y(top[i])))
		}
		for i := len(tl.Times) - 1; i >= 0; i-- {
			fmt.Fprintf(&pts, "%s,%s ", f(s.x(tl.Times[i])), f(s.y(base[i])))
		}
		peak := memapi.Bytes(0)
		for _, v := range l.values {
			peak = max(peak, v)
		}
		p("<polygon class=\"layer\" data-kind=\"%s\" data-holder=\"%s\" data-role=\"%s\" data-values=\"%s\" fill=\"%s\" fill-opacity=\"%s\" stroke=\"none\" points=\"%s\">",
			l.kind, esc(l.holder), esc(l.role), joinBytes(l.values), l.colour, f(l.opacity()), strings.TrimSpace(pts.String()))
		p("<title>%s: peak %s</title></polygon>\n", esc(l.label), esc(FormatBytes(peak)))
		base = top
	}
	// Capacity line.
	if len(tl.Times) > 0 {
		var pts strings.Builder
		for i, t := range tl.Times {
			if i > 0 && tl.Capacity[i] != tl.Capacity[i-1] { // a step, not a slope
				fmt.Fprintf(&pts, "%s,%s ", f(s.x(t)), f(s.y(tl.Capacity[i-1])))
			}
			fmt.Fprintf(&pts, "%s,%s ", f(s.x(t)), f(s.y(tl.Capacity[i])))
		}
		p("<polyline class=\"cap\" data-values=\"%s\" points=\"%s\"><title>capacity %s</title></polyline>\n",
			joinBytes(tl.Capacity), strings.TrimSpace(pts.String()), esc(FormatBytes(tl.Capacity[len(tl.Capacity)-1])))
	}
	// Pressure markers: ticks in a strip above the plot, so they never
	// hide the areas.
	for _, e := range tl.Events {
		if !marked(e.Kind) {
			continue
		}
		x := s.x(e.Time)
		p("<line class=\"mark\" data-kind=\"%s\" stroke=\"%s\" x1=\"%s\" y1=\"%d\" x2=\"%s\" y2=\"%d\"><title>%s at %ss: %s %s (%s)</title></line>\n",
			esc(e.Kind), kindColour(e.Kind), f(x), padTop-14, f(x), padTop-3, esc(e.Kind), strconv.FormatFloat(e.Time, 'f', 3, 64),
			esc(string(e.Holder)), esc(e.Role), esc(FormatBytes(e.Bytes)))
	}
	p("<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", padLeft, padTop, padLeft, padTop+plotH)
	p("<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", padLeft, padTop+plotH, padLeft+plotW, padTop+plotH)
	// Legend, top of the stack first.
	lx, ly := padLeft+plotW+18, padTop+6
	for i := len(ls) - 1; i >= 0; i-- {
		l := ls[i]
		p("<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\" fill-opacity=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n", lx, ly, l.colour, f(l.opacity()), lx+20, ly+12, esc(l.label))
		ly += 22
	}
	p("<line class=\"cap\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" y=\"%d\">capacity</text>\n", lx, ly+7, lx+14, ly+7, lx+20, ly+12)
	ly += 22
	p("<line class=\"mark\" stroke=\""+pressureColour+"\" style=\"opacity:1\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" y=\"%d\">pressure events (%d)</text>\n",
		lx+7, ly, lx+7, ly+14, lx+20, ly+12, tl.EventCounts["pressure"])
	p("</svg>\n")
}

// writeLedger writes the ledger at the end of the work (or the latest
// sample when the program marked none) per authority and holder, each
// holder's charge split into in use, cached and quarantined bytes.
func writeLedger(w *bufio.Writer, rep Report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	l := rep.Ledger
	if len(l.Authorities) == 0 {
		return
	}
	when := "latest sample"
	if l.Marked {
		when = "end of the work"
	}
	p("<h2>Ledger at the %s (t = %s s)</h2>\n<div class=\"wide\"><table class=\"ledger-authorities\">\n<tr><th class=\"k\">authority</th><th>capacity</th><th>reserved</th><th>charged</th><th>of it cached</th><th>quarantined</th><th>pending</th><th>free</th><th>balanced</th><th>grants</th><th>waited</th><th>over budget</th><th>tickets</th><th>reclaimed</th><th>pressure events</th></tr>\n",
		when, strconv.FormatFloat(l.Time, 'f', 3, 64))
	for _, a := range l.Authorities {
		p("<tr data-authority=\"%s\" data-cached=\"%d\" data-quarantined=\"%d\"><td class=\"k\">%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%t</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%s</td><td>%d</td></tr>\n",
			esc(string(a.Authority)), a.Cached, a.Quarantined, esc(string(a.Authority)), FormatBytes(a.Capacity), FormatBytes(a.Reserved), FormatBytes(a.Charged),
			FormatBytes(a.Cached), FormatBytes(a.Quarantined), FormatBytes(a.Pending), FormatBytes(a.Free),
			a.Balanced, a.Granted, a.Waited, a.OverBudget, a.Tickets, FormatBytes(a.Reclaimed), a.PressureEvents)
	}
	p("</table></div>\n<div class=\"wide\"><table class=\"ledger-holders\">\n<tr><th class=\"k\">holder</th><th class=\"k\">authority</th><th>priority</th><th>charged</th><th>in use</th><th>cached</th><th>quarantined</th><th>pending</th><th>reserved</th><th>tickets</th><th>reclaimed</th></tr>\n")
	for _, h := range l.Holders {
		p("<tr data-holder=\"%s\" data-charged=\"%d\" data-in-use=\"%d\" data-cached=\"%d\" data-quarantined=\"%d\"><td class=\"k\">%s</td><td class=\"k\">%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%s</td></tr>\n",
			esc(string(h.Holder)), h.Charged, h.InUse, h.Cached, h.Quarantined, esc(string(h.Holder)), esc(string(h.Authority)), h.Priority,
			FormatBytes(h.Charged), FormatBytes(h.InUse), FormatBytes(h.Cached), FormatBytes(h.Quarantined), FormatBytes(h.Pending), FormatBytes(h.Reserved), h.Tickets, FormatBytes(h.Reclaimed))
	}
	p("</table></div>\n")
}

// kindColour is the colour of an event kind's marks (the page's script
// has the same table).
func kindColour(kind string) string {
	switch kind {
	case "pressure":
		return pressureColour
	case "ticket":
		return "#e67e22"
	case "offload":
		return "#8e44ad"
	case "reload":
		return "#2980b9"
	case "preemption":
		return "#6d4c41"
	case "resume":
		return "#27ae60"
	}
	return "#7f8c8d"
}

func esc(s string) string { return html.EscapeString(s) }

func f(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }

func joinBytes(vs []memapi.Bytes) string {
	var b strings.Builder
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatUint(uint64(v), 10))
	}
	return b.String()
}

// FormatBytes writes n with a binary unit: 512 B, 1.5 KiB, 96 MiB, 2.25 GiB.
func FormatBytes(n memapi.Bytes) string { return bytesize.Human(uint64(n)) }

// FormatDuration formats a duration in the unit that suits it, with three
// significant digits: "830 ns", "12.3 µs", "1.45 ms", "2.50 s". A latency
// reads at a glance, where time.Duration's own form prints every digit
// ("1.234567ms").
func FormatDuration(d time.Duration) string {
	if d < 0 {
		return "-" + FormatDuration(-d)
	}
	v, unit := float64(d), "ns"
	for _, u := range []struct {
		scale float64
		name  string
	}{{1e9, "s"}, {1e6, "ms"}, {1e3, "\u00b5s"}} {
		if float64(d) >= u.scale {
			v, unit = float64(d)/u.scale, u.name
			break
		}
	}
	if unit == "ns" {
		return strconv.FormatInt(int64(d), 10) + " ns"
	}
	digits := 2
	switch {
	case v >= 100:
		digits = 0
	case v >= 10:
		digits = 1
	}
	return strconv.FormatFloat(v, 'f', digits, 64) + " " + unit
}

// niceCeil rounds v up to a round byte figure (a small round multiple of a
// power of 1024), so the axis ticks read well.
func niceCeil(v memapi.Bytes) memapi.Bytes {
	if v == 0 {
		return 0
	}
	unit := memapi.Bytes(1)
	for unit*1024 <= v && unit < 1<<50 {
		unit *= 1024
	}
	for _, m := range []memapi.Bytes{1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 40, 50, 64, 80, 100, 128, 160, 200, 256, 320, 400, 500, 512, 640, 800, 1000, 1024} {
		if m*unit >= v {
			return m * unit
		}
	}
	return 1024 * unit
}

// ticks returns about five evenly spaced values from 0 to vmax.
func ticks(vmax memapi.Bytes) []memapi.Bytes {
	out := make([]memapi.Bytes, 0, 6)
	for i := 0; i <= 4; i++ {
		out = append(out, vmax*memapi.Bytes(i)/4)
	}
	return out
}

// timeTicks returns round times from 0 to tmax, about six of them.
func timeTicks(tmax float64) []float64 {
	if tmax <= 0 {
		return []float64{0}
	}
	raw := tmax / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for t := 0.0; t <= tmax*(1+1e-9); t += step {
		out = append(out, math.Round(t/step)*step)
	}
	return out
}

// writeVerdict writes the line the page opens with, under its title: every
// check passed, or how many failed and which. A report without checks has
// none.
func writeVerdict(w *bufio.Writer, rep Report) {
	if len(rep.Checks) == 0 {
		return
	}
	var failed []string
	for _, c := range rep.Checks {
		if !c.Passed {
			failed = append(failed, c.Label)
		}
	}
	if len(failed) == 0 {
		fmt.Fprintf(w, "<p class=\"verdict pass\" id=\"verdict\">PASS: all %d checks passed</p>\n", len(rep.Checks))
		return
	}
	fmt.Fprintf(w, "<p class=\"verdict fail\" id=\"verdict\">FAIL: %d of %d checks failed: %s</p>\n", len(failed), len(rep.Checks), esc(strings.Join(failed, ", ")))
}

// writeChecks writes the checks, each with its result, after the
// program's tables and before the charts.
func writeChecks(w *bufio.Writer, rep Report) {
	if len(rep.Checks) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("<h2>Checks</h2>\n<div class=\"wide\"><table class=\"checks\">\n")
	for _, c := range rep.Checks {
		result, class := "pass", "pass"
		if !c.Passed {
			result, class = "FAIL", "fail"
		}
		p("<tr data-key=\"%s\"><td class=\"%s\">%s</td><td class=\"k\">%s</td><td class=\"k\">%s</td></tr>\n", esc(c.Key), class, result, esc(c.Label), esc(c.Text))
	}
	p("</table></div>\n")
}

// writeTables writes the program's tables (a comparison with baselines,
// an allocator's figures): what a reader compares first, so at the top.
func writeTables(w *bufio.Writer, rep Report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	for _, t := range rep.Tables {
		p("<section class=\"table\" data-key=\"%s\">\n<h2>%s</h2>\n", esc(t.Key), esc(t.Title))
		if t.Caption != "" {
			p("<p class=\"sub\">%s</p>\n", esc(t.Caption))
		}
		p("<div class=\"wide\"><table class=\"program\" data-key=\"%s\">\n<thead><tr>", esc(t.Key))
		for i, c := range t.Columns {
			class := ""
			if i == 0 {
				class = " class=\"k\""
			}
			p("<th%s>%s</th>", class, esc(c))
		}
		p("</tr></thead><tbody>\n")
		for _, row := range t.Rows {
			p("<tr>")
			for i, c := range row {
				class := ""
				if i == 0 {
					class = " class=\"k\""
				}
				p("<td%s>%s</td>", class, esc(c))
			}
			p("</tr>\n")
		}
		p("</tbody></table></div>\n</section>\n")
	}
}
