package memreport

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// chromium returns the headless browser the page tests run, or skips the
// test (failing it instead when MEMREPORT_REQUIRE_CHROMIUM is set, as
// scripts/report-screenshot.sh --check sets it).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, b := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(b); err == nil {
			return p
		}
	}
	msg := "SKIP: no Chromium (chromium, chromium-browser or google-chrome on PATH, or $CHROMIUM): the report's page is not tested in a browser; apt-get install -y chromium, or run scripts/report-screenshot.sh --install --check"
	if os.Getenv("MEMREPORT_REQUIRE_CHROMIUM") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// headless runs the browser on the page at url with a window of width x
// height and extra flags, and returns its standard output.
func headless(t *testing.T, browser, url string, width, height int, flags ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--hide-scrollbars", "--user-data-dir=" + t.TempDir(),
		fmt.Sprintf("--window-size=%d,%d", width, height)}, flags...)
	cmd := exec.CommandContext(ctx, browser, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "%s: %s", browser, stderr.String())
	return stdout.Bytes()
}

// TestReportInChromium loads the report in headless Chromium with a view
// in the URL fragment (a zoom, a holder switched off, a cursor) and checks
// the page the script made, at two widths; then it takes screenshots.
func TestReportInChromium(t *testing.T) {
	browser := chromium(t)
	rec, snaps := fullScenario(t)
	// An event before the zoomed window, of a kind the table lists.
	rec.Annotate(Annotation{Time: snaps[0].Time, Authority: "dev", Kind: "offload", Holder: "weights", Bytes: mib})
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	f, err := os.Create(page)
	require.NoError(t, err)
	require.NoError(t, rec.WriteHTML(f))
	require.NoError(t, f.Close())
	rep := rec.Report()
	// The scenario's samples are at 1..6 s; zoom on 2.5..5.5 s, kv off,
	// the cursor at 4.5 s: the fourth sample (4 s) holds there.
	url := "file://" + page + "#t0=2.5&t1=5.5&hide=kv&cursor=4.5"
	for _, width := range []int{1600, 800} {
		dom := string(headless(t, browser, url, width, 1200, "--dump-dom"))
		require.Contains(t, dom, `<body class="live" data-t0="2.5" data-t1="5.5" data-hidden="kv">`, "the view in the fragment was applied")
		lives := regexp.MustCompile(`<svg[^>]*class="timeline live"[^>]*>`).FindAllString(dom, -1)
		require.Len(t, lives, len(rep.Authorities), "the script redrew every chart")
		for _, s := range lives {
			w, err := strconv.Atoi(regexp.MustCompile(` width="(\d+)"`).FindStringSubmatch(s)[1])
			require.NoError(t, err)
			require.LessOrEqual(t, w, width, "the chart fits the window")
			require.Greater(t, w, width*3/4, "the chart follows the window's width")
			require.Contains(t, s, `data-t0="2.5"`)
			require.Contains(t, s, `data-t1="5.5"`)
		}
		// kv is switched off: no live layer of it; weights still drawn.
		live := dom[strings.Index(dom, `class="timeline live"`):]
		require.NotContains(t, live, `data-holder="kv"`+" fill=")
		require.Regexp(t, `<polygon class="layer" data-kind="holder" data-holder="weights"`, live)
		// The time axis shows the zoomed window: ticks from 2.5 to 5.5.
		var ticks []float64
		for _, m := range regexp.MustCompile(`<text class="tick"[^>]*>([0-9.]+)</text>`).FindAllStringSubmatch(strings.Split(live, "</svg>")[0], -1) {
			v, _ := strconv.ParseFloat(m[1], 64)
			ticks = append(ticks, v)
		}
		require.NotEmpty(t, ticks)
		for _, v := range ticks {
			require.True(t, v >= 2.5 && v <= 5.5, "tick %v in the window", v)
		}
		// The cursor readout: the time and each shown holder's bytes at the
		// sample holding at 4.5 s (the fourth: weights 40 MiB).
		require.Regexp(t, `<div class="readout" data-authority="dev" data-time="4.5">t = 4.5 s · [^<]*weights \(weights\) 40 MiB[^<]*capacity 100 MiB</div>`, dom)
		require.NotRegexp(t, `data-authority="dev" data-time="4.5">[^<]*kv \(kv-cache\)`, dom, "a holder switched off is not read out")
		// The events table shows the window's events only.
		rows := regexp.MustCompile(`<tr data-event="\d+" data-time="([0-9.e-]+)" data-kind="(\w+)" data-holder="(\w*)" class="([^"]*)">`).FindAllStringSubmatch(dom, -1)
		require.Len(t, rows, len(rep.Authorities[0].Events)+len(rep.Authorities[1].Events), "every row read")
		outside := 0
		for _, m := range rows {
			tm, _ := strconv.ParseFloat(m[1], 64)
			in := tm >= 2.5 && tm <= 5.5 && !(m[3] == "kv" && m[2] != "pressure") && marked(m[2]) // the routine kinds start hidden
			require.Equal(t, !in, strings.Contains(m[4], "out"), "event at %v (%s %s) shown iff in the window", tm, m[2], m[3])
			if tm < 2.5 && marked(m[2]) {
				outside++
			}
		}
		require.NotZero(t, outside, "the window hides an event the table would list")
		require.Contains(t, dom, "kept events in the window 2.5–5.5 s")
	}
	_ = snaps

	// The fragment chooses the kinds the events table lists.
	dom := string(headless(t, browser, "file://"+page+"#kinds=served,capacity", 1000, 800, "--dump-dom"))
	rows := regexp.MustCompile(`<tr data-event="\d+" data-time="[0-9.e-]+" data-kind="(\w+)"[^>]*?class="([^"]*)"`).FindAllStringSubmatch(dom, -1)
	require.NotEmpty(t, rows)
	for _, m := range rows {
		require.Equal(t, m[1] != "served" && m[1] != "capacity", strings.Contains(m[2], "out"), "%s rows", m[1])
	}

	// Screenshots at both widths, read back as PNG of the window's size.
	for _, width := range []int{1600, 800} {
		shot := filepath.Join(dir, fmt.Sprintf("shot-%d.png", width))
		headless(t, browser, "file://"+page, width, 1000, "--screenshot="+shot)
		f, err := os.Open(shot)
		require.NoError(t, err)
		img, err := png.Decode(f)
		f.Close()
		require.NoError(t, err)
		require.Equal(t, width, img.Bounds().Dx())
	}
}
