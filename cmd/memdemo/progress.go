package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/memreport"
	"golang.org/x/sys/unix"
)

// progressState is what the progress display shows.
type progressState struct {
	done, total       int
	running, waiting  int
	sim               time.Duration
	charged, capacity memapi.Bytes
	preempted         uint64
}

// progress draws a bar on a terminal (redrawn in place, at most ten times a
// second) or writes a plain line every few seconds otherwise.
type progress struct {
	w      io.Writer
	mode   string // "bar", "line" or "off"
	every  time.Duration
	now    func() time.Time
	last   time.Time
	drawn  bool
	width  int
	latest progressState
}

// newProgress picks the display for w: "auto" is a bar when w is a
// terminal and periodic lines otherwise.
func newProgress(w io.Writer, mode string) *progress {
	if mode == "auto" {
		mode = "line"
		if f, ok := w.(*os.File); ok && isTerminal(f) {
			mode = "bar"
		}
	}
	p := &progress{w: w, mode: mode, now: time.Now, width: 30}
	switch mode {
	case "bar":
		p.every = 100 * time.Millisecond
	case "line":
		p.every = 5 * time.Second
	}
	return p
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// update shows s when the display is due.
func (p *progress) update(s progressState) {
	if p == nil || p.mode == "off" {
		return
	}
	p.latest = s
	now := p.now()
	if !p.last.IsZero() && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	p.draw(s)
}

func (p *progress) draw(s progressState) {
	switch p.mode {
	case "bar":
		fmt.Fprintf(p.w, "\r\033[K%s", p.bar(s))
		p.drawn = true
	case "line":
		fmt.Fprintf(p.w, "memdemo: %s\n", p.line(s))
	}
}

// done draws the final state and ends the bar's line.
func (p *progress) done() {
	if p == nil || p.mode == "off" || p.last.IsZero() {
		return
	}
	p.draw(p.latest)
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}

func (p *progress) bar(s progressState) string {
	frac := 0.0
	if s.total > 0 {
		frac = float64(s.done) / float64(s.total)
	}
	full := int(frac * float64(p.width))
	return fmt.Sprintf("[%s%s] %3.0f%% %s", strings.Repeat("#", full), strings.Repeat(".", p.width-full), 100*frac, p.line(s))
}

func (p *progress) line(s progressState) string {
	return fmt.Sprintf("%d/%d requests, %d running, %d waiting, %d preemptions, sim %s, charged %s of %s",
		s.done, s.total, s.running, s.waiting, s.preempted, s.sim.Truncate(time.Second), memreport.FormatBytes(s.charged), memreport.FormatBytes(s.capacity))
}
