package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memreport"
	"golang.org/x/term"
)

// progressState is what the progress display shows.
type progressState struct {
	done, total       int
	running, waiting  int
	sim               time.Duration
	charged, capacity memapi.Bytes
	preempted         uint64
}

// defaultWidth is the width assumed where the terminal's is unknown.
const defaultWidth = 80

// progress draws a bar on a terminal, one line rewritten in place (at
// most ten times a second) and cut to the terminal's width, so it never
// wraps; otherwise it writes a plain line every few seconds. Both show an
// estimate of the wall time left.
type progress struct {
	w      io.Writer
	mode   string // "bar", "line" or "off"
	every  time.Duration
	now    func() time.Time
	width  func() int // the terminal's columns
	start  time.Time
	last   time.Time
	drawn  bool
	latest progressState
}

// newProgress picks the display for w: "auto" is a bar when w is a
// terminal and periodic lines otherwise.
func newProgress(w io.Writer, mode string) *progress {
	f, _ := w.(*os.File)
	if mode == "auto" {
		mode = "line"
		if f != nil && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	p := &progress{w: w, mode: mode, now: time.Now, width: func() int { return defaultWidth }}
	if f != nil {
		p.width = func() int {
			if c, _, err := term.GetSize(int(f.Fd())); err == nil && c > 0 {
				return c
			}
			return defaultWidth
		}
	}
	switch mode {
	case "bar":
		p.every = 100 * time.Millisecond
	case "line":
		p.every = 5 * time.Second
	}
	return p
}

// update shows s when the display is due.
func (p *progress) update(s progressState) {
	if p == nil || p.mode == "off" {
		return
	}
	p.latest = s
	now := p.now()
	if p.start.IsZero() {
		p.start = now
	}
	if !p.last.IsZero() && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	p.draw(s, now)
}

func (p *progress) draw(s progressState, now time.Time) {
	switch p.mode {
	case "bar":
		fmt.Fprintf(p.w, "\r%s\033[K", p.bar(s, now, p.width()-1))
		p.drawn = true
	case "line":
		fmt.Fprintf(p.w, "memdemo: %s\n", strings.Join(p.fields(s, now), ", "))
	}
}

// done draws the final state and ends the bar's line.
func (p *progress) done() {
	if p == nil || p.mode == "off" || p.last.IsZero() {
		return
	}
	p.draw(p.latest, p.now())
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

// eta estimates the wall time left from the pace so far.
func (p *progress) eta(s progressState, now time.Time) string {
	if s.done >= s.total {
		return "done"
	}
	el := now.Sub(p.start)
	if s.done == 0 || el <= 0 {
		return "ETA -"
	}
	left := time.Duration(float64(el) * float64(s.total-s.done) / float64(s.done))
	return "ETA " + left.Round(time.Second).String()
}

// fields are the display's figures, the most important first.
func (p *progress) fields(s progressState, now time.Time) []string {
	return []string{
		fmt.Sprintf("%d/%d requests", s.done, s.total),
		p.eta(s, now),
		fmt.Sprintf("%d running", s.running),
		fmt.Sprintf("%d waiting", s.waiting),
		fmt.Sprintf("%d preempted", s.preempted),
		"sim " + s.sim.Truncate(time.Second).String(),
		fmt.Sprintf("%s of %s", memreport.FormatBytes(s.charged), memreport.FormatBytes(s.capacity)),
	}
}

// bar returns the bar line in at most width columns: a bar of a quarter
// of the width (10 to 30 cells), the percentage, then as many figures as
// fit.
func (p *progress) bar(s progressState, now time.Time, width int) string {
	frac := 0.0
	if s.total > 0 {
		frac = min(float64(s.done)/float64(s.total), 1)
	}
	pctText := fmt.Sprintf("%3.0f%%", 100*frac)
	cells := min(30, max(10, width/4))
	room := width - cells - 3 - len(pctText)
	if room < 0 {
		// Too narrow for a bar: the percentage and what fits.
		return truncate(pctText+"  "+strings.Join(p.fields(s, now), "  "), width)
	}
	text := ""
	for _, f := range p.fields(s, now) {
		if len(text)+2+len(f) > room {
			break
		}
		text += "  " + f
	}
	full := int(frac * float64(cells))
	return "[" + strings.Repeat("#", full) + strings.Repeat(".", cells-full) + "] " + pctText + text
}

func truncate(s string, width int) string {
	if width <= 0 {
		return ""
	}
	if len(s) > width {
		return s[:width]
	}
	return s
}
