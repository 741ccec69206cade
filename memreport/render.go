package memreport

import (
	"bufio"
	"cmp"
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
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

const style = `body{font-family:sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
p.sub{color:#555;margin:0 0 16px;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:6px 0 12px}
th,td{border:1px solid #ccc;padding:3px 9px;text-align:right}
th{background:#f2f2f2}td.k,th.k{text-align:left}
svg{display:block;margin:4px 0}
svg text{font-family:sans-serif;font-size:12px;fill:#333}
svg .axis{stroke:#555;stroke-width:1}svg .grid{stroke:#e6e6e6;stroke-width:1}
svg .cap{fill:none;stroke:#111;stroke-width:2;stroke-dasharray:7 4}
svg .mark{stroke:` + pressureColour + `;stroke-width:1.2;opacity:.6}`

// WriteHTML writes the report as a self-contained HTML page (XHTML syntax,
// so it is well-formed XML): the summary notes, one SVG chart per
// authority, and tables of the final snapshot.
func (rep Report) WriteHTML(w io.Writer) error {
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p("<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n")
	p("<title>%s</title>\n<style>%s</style>\n</head>\n<body>\n", esc(rep.Title), style)
	p("<h1>%s</h1>\n", esc(rep.Title))
	if !rep.Start.IsZero() {
		p("<p class=\"sub\">Times are seconds since %s. Stacked areas: each holder's charged bytes (the steadiest at the bottom), then the bytes pending free (released, waiting for device fences) and the bytes reserved by open grants; the dashed line is the capacity; red ticks above the plot mark pressure events.</p>\n",
			esc(rep.Start.UTC().Format("2006-01-02 15:04:05.000 UTC")))
	}
	colours := holderColours(rep)
	for _, tl := range rep.Authorities {
		p("<h2>Authority %s</h2>\n", esc(string(tl.Authority)))
		writeChart(bw, rep, tl, colours)
		if len(tl.Times) < tl.Samples {
			p("<p class=\"sub\">%d of %d samples kept (evenly spaced, the last always kept).</p>\n", len(tl.Times), tl.Samples)
		}
	}
	if len(rep.Notes) > 0 {
		p("<h2>Summary</h2>\n<table class=\"notes\">\n")
		for _, n := range rep.Notes {
			p("<tr><td class=\"k\">%s</td><td class=\"k\">%s</td></tr>\n", esc(n.Key), esc(n.Value))
		}
		p("</table>\n")
	}
	writeFinal(bw, rep)
	p("</body>\n</html>\n")
	return bw.Flush()
}

// scale maps the timeline's values into the plot area.
type scale struct {
	tmax float64
	vmax float64
}

func (s scale) x(t float64) float64 { return padLeft + t/s.tmax*plotW }

func (s scale) y(v memapi.Bytes) float64 { return padTop + plotH - float64(v)/s.vmax*plotH }

func newScale(tl Timeline) scale {
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

// layers returns the stack bottom to top: holders from the steadiest (the
// least total variation of their charge over the timeline) to the most
// variable, so pinned data forms a flat base, then pending and reserved
// bytes. colours gives every holder the same colour on every chart.
func layers(tl Timeline, colours map[governor.HolderID]string) []layer {
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
		ls = append(ls, layer{kind: "holder", holder: string(h.Holder), role: h.Role, label: label,
			colour: colours[h.Holder], values: h.Charged})
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

func writeChart(w *bufio.Writer, rep Report, tl Timeline, colours map[governor.HolderID]string) {
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
		p("<polygon class=\"layer\" data-kind=\"%s\" data-holder=\"%s\" data-role=\"%s\" data-values=\"%s\" fill=\"%s\" fill-opacity=\"0.9\" stroke=\"none\" points=\"%s\">",
			l.kind, esc(l.holder), esc(l.role), joinBytes(l.values), l.colour, strings.TrimSpace(pts.String()))
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
		x := s.x(e.Time)
		p("<line class=\"mark\" data-kind=\"%s\" x1=\"%s\" y1=\"%d\" x2=\"%s\" y2=\"%d\"><title>%s at %ss: %s %s (%s)</title></line>\n",
			esc(e.Kind), f(x), padTop-14, f(x), padTop-3, esc(e.Kind), strconv.FormatFloat(e.Time, 'f', 3, 64),
			esc(string(e.Holder)), esc(e.Role), esc(FormatBytes(e.Bytes)))
	}
	p("<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", padLeft, padTop, padLeft, padTop+plotH)
	p("<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", padLeft, padTop+plotH, padLeft+plotW, padTop+plotH)
	// Legend, top of the stack first.
	lx, ly := padLeft+plotW+18, padTop+6
	for i := len(ls) - 1; i >= 0; i-- {
		l := ls[i]
		p("<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n", lx, ly, l.colour, lx+20, ly+12, esc(l.label))
		ly += 22
	}
	p("<line class=\"cap\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" y=\"%d\">capacity</text>\n", lx, ly+7, lx+14, ly+7, lx+20, ly+12)
	ly += 22
	p("<line class=\"mark\" style=\"opacity:1\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><text x=\"%d\" y=\"%d\">pressure events (%d)</text>\n",
		lx+7, ly, lx+7, ly+14, lx+20, ly+12, tl.EventCounts[governor.EventPressure.String()])
	p("</svg>\n")
}

func writeFinal(w *bufio.Writer, rep Report) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	if len(rep.Final.Authorities) == 0 {
		return
	}
	p("<h2>Final ledger</h2>\n<table class=\"final-authorities\">\n<tr><th class=\"k\">authority</th><th>capacity</th><th>reserved</th><th>charged</th><th>pending</th><th>free</th><th>balanced</th><th>grants</th><th>tickets</th><th>reclaimed</th><th>pressure events</th></tr>\n")
	for _, a := range rep.Final.Authorities {
		p("<tr data-authority=\"%s\"><td class=\"k\">%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%t</td><td>%d</td><td>%d</td><td>%s</td><td>%d</td></tr>\n",
			esc(string(a.ID)), esc(string(a.ID)), FormatBytes(a.Capacity), FormatBytes(a.Reserved), FormatBytes(a.Charged), FormatBytes(a.Pending), FormatBytes(a.Free),
			a.Balanced(), a.Granted, a.Tickets, FormatBytes(a.Freed), a.PressureEvents)
	}
	p("</table>\n<table class=\"final-holders\">\n<tr><th class=\"k\">holder</th><th class=\"k\">authority</th><th>priority</th><th>charged</th><th>pending</th><th>reserved</th><th>tickets</th><th>reclaimed</th></tr>\n")
	for _, h := range rep.Final.Holders {
		for _, ha := range h.Authorities {
			p("<tr data-holder=\"%s\" data-charged=\"%d\"><td class=\"k\">%s</td><td class=\"k\">%s</td><td>%d</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%s</td></tr>\n",
				esc(string(h.ID)), ha.Charged, esc(string(h.ID)), esc(string(ha.Authority)), h.Priority,
				FormatBytes(ha.Charged), FormatBytes(ha.Pending), FormatBytes(ha.Reserved), ha.Tickets, FormatBytes(ha.Freed))
		}
	}
	p("</table>\n")
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
func FormatBytes(n memapi.Bytes) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(uint64(n), 10) + " B"
	}
	v := float64(n)
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB"}
	i := -1
	for v >= unit && i < len(units)-1 {
		v /= unit
		i++
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) + " " + units[i]
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
