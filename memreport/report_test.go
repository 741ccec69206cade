package memreport

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/stretchr/testify/require"
)

// manualClock is a governor clock the test moves by hand.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *manualClock) AfterFunc(time.Duration, func()) func() bool {
	return func() bool { return true }
}

const mib = memapi.Bytes(1 << 20)

// scenario drives a real governor through charges, a pending release and a
// pressure event, sampling after each step. It returns the recorder and
// the snapshots it took.
func scenario(t *testing.T) (*Recorder, []governor.Snapshot) {
	t.Helper()
	clk := &manualClock{now: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)}
	rec := New(Options{Title: "test <report>"})
	g := governor.New(governor.Options{Clock: clk, OnEvent: rec.Event})
	t.Cleanup(func() { _ = g.Close() })
	require.NoError(t, g.AddAuthority("dev", 100*mib))
	require.NoError(t, g.AddAuthority("host", 64*mib))

	var kvLeases []governor.Lease
	var kvMu sync.Mutex
	kv := governor.HolderFunc(func(_ context.Context, tk governor.Ticket) (memapi.Bytes, error) {
		kvMu.Lock()
		defer kvMu.Unlock()
		var freed memapi.Bytes
		for freed < tk.Wanted && len(kvLeases) > 0 {
			l := kvLeases[0]
			kvLeases = kvLeases[1:]
			n := l.Bytes()
			if err := l.Refund(n); err != nil {
				return freed, err
			}
			freed += n
		}
		return freed, nil
	})
	require.NoError(t, g.Register("kv", kv, governor.HolderOptions{Priority: 1}))
	require.NoError(t, g.Register("weights", nil, governor.HolderOptions{Priority: 10}))
	rec.Label("kv", "kv-cache")

	charge := func(auth memapi.AuthorityID, h governor.HolderID, role string, n memapi.Bytes) governor.Lease {
		gr, err := g.Reserve(context.Background(), governor.Request{Authority: auth, Holder: h, Role: role, Bytes: n})
		require.NoError(t, err)
		require.NoError(t, gr.Draw(n))
		l, err := gr.Commit()
		require.NoError(t, err)
		return l
	}
	var snaps []governor.Snapshot
	step := func() {
		clk.advance(time.Second)
		s := g.Snapshot()
		rec.Sample(s)
		snaps = append(snaps, s)
	}
	step()
	charge("dev", "weights", "weights", 40*mib)
	charge("host", "weights", "offload", 8*mib)
	step()
	for range 3 {
		kvLeases = append(kvLeases, charge("dev", "kv", "kv-cache", 10*mib))
	}
	step()
	require.NoError(t, kvLeases[2].MarkPending(4*mib))
	step()
	// 30 MiB free less 4 pending: a 40 MiB grant needs a ticket to kv.
	gr, err := g.Reserve(context.Background(), governor.Request{Authority: "dev", Holder: "weights", Role: "weights", Bytes: 40 * mib, Priority: 5})
	require.NoError(t, err)
	require.NoError(t, gr.Draw(40*mib))
	_, err = gr.Commit()
	require.NoError(t, err)
	step()
	return rec, snaps
}

func TestReportValuesMatchSnapshots(t *testing.T) {
	rec, snaps := scenario(t)
	rep := rec.Report()
	require.Len(t, rep.Authorities, 2)
	for _, tl := range rep.Authorities {
		require.Len(t, tl.Times, len(snaps))
		require.Equal(t, len(snaps), tl.Samples)
		for i, s := range snaps {
			require.InDelta(t, s.Time.Sub(rep.Start).Seconds(), tl.Times[i], 1e-9)
			a := authorityOf(t, s, tl.Authority)
			require.Equal(t, a.Capacity, tl.Capacity[i])
			require.Equal(t, a.Reserved, tl.Reserved[i])
			require.Equal(t, a.Charged, tl.Charged[i])
			require.Equal(t, a.Pending, tl.Pending[i])
			var sum memapi.Bytes
			for _, h := range tl.Holders {
				require.Equal(t, holderCharged(s, h.Holder, tl.Authority), h.Charged[i], "%s %s sample %d", tl.Authority, h.Holder, i)
				sum += h.Charged[i]
			}
			require.Equal(t, a.Charged, sum, "holder series add up to the authority's charge")
		}
	}
	dev := rep.Authorities[0]
	require.Equal(t, memapi.AuthorityID("dev"), dev.Authority)
	require.Len(t, dev.Holders, 2)
	kv, ok := dev.Holder("kv")
	require.True(t, ok)
	require.Equal(t, "kv-cache", kv.Role, "labelled by the program")
	w, ok := dev.Holder("weights")
	require.True(t, ok)
	require.Equal(t, "weights", w.Role, "learned from the pressure event it caused")
	require.Equal(t, uint64(1), dev.EventCounts["pressure"])
	require.Equal(t, uint64(1), dev.EventCounts["ticket"])
	require.Equal(t, uint64(1), dev.EventCounts["reclaimed"])
	pressure := eventsOf(dev, "pressure")
	require.Len(t, pressure, 1)
	require.Equal(t, "weights", pressure[0].Holder)
	require.Equal(t, snaps[0].Time.Add(-time.Second), rep.Start, "the report starts at the authorities' capacity events, a second before the first sample")
	require.InDelta(t, 4.0, pressure[0].Time, 1e-9, "the pressure happened at the fourth sample's time")
	// The ticket to kv: asked for the 14 MiB short (40 wanted, 30 free
	// less 4 pending), answered with a 10 MiB lease released.
	tickets := eventsOf(dev, "ticket")
	require.Len(t, tickets, 1)
	require.Equal(t, "kv", tickets[0].Holder, "the holder asked")
	require.True(t, tickets[0].Answered)
	require.Equal(t, 10*mib, tickets[0].Freed)
	require.NotZero(t, tickets[0].Bytes)
	require.NotZero(t, tickets[0].Ticket)
	require.Zero(t, tickets[0].AnswerSeconds, "the test's clock did not move while kv answered")
	require.GreaterOrEqual(t, tickets[0].AnswerWallSeconds, 0.0)
	require.Len(t, eventsOf(dev, "reclaimed"), 0, "a reclaimed event completes its ticket's entry")
	host := rep.Authorities[1]
	require.Len(t, host.Holders, 1, "kv never used the host authority")
}

func eventsOf(tl timeline, kind string) []event {
	var out []event
	for _, e := range tl.Events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

func authorityOf(t *testing.T, s governor.Snapshot, id memapi.AuthorityID) governor.AuthoritySnapshot {
	for _, a := range s.Authorities {
		if a.ID == id {
			return a
		}
	}
	t.Fatalf("no authority %s", id)
	return governor.AuthoritySnapshot{}
}

func holderCharged(s governor.Snapshot, h governor.HolderID, auth memapi.AuthorityID) memapi.Bytes {
	for _, hs := range s.Holders {
		if hs.ID != h {
			continue
		}
		for _, ha := range hs.Authorities {
			if ha.Authority == auth {
				return ha.Charged
			}
		}
	}
	return 0
}

func TestJSONRoundTrip(t *testing.T) {
	rec, snaps := scenario(t)
	rec.Note("requests served", "42")
	var buf bytes.Buffer
	require.NoError(t, rec.WriteJSON(&buf))
	var got Report
	require.NoError(t, json.Unmarshal(buf.Bytes(), &got))
	want := rec.Report()
	require.Equal(t, want.Title, got.Title)
	require.Equal(t, []note{{Key: "requests_served", Label: "requests served", Text: "42"}}, got.Notes)
	require.Equal(t, version, got.Version)
	require.Len(t, got.Authorities, len(want.Authorities))
	for i := range want.Authorities {
		require.Equal(t, want.Authorities[i].Holders, got.Authorities[i].Holders)
		require.Equal(t, want.Authorities[i].Capacity, got.Authorities[i].Capacity)
		require.Equal(t, want.Authorities[i].Times, got.Authorities[i].Times)
	}
	last := snaps[len(snaps)-1]
	require.False(t, got.Ledger.Marked, "no end marked: the latest sample")
	require.Len(t, got.Ledger.Authorities, len(last.Authorities))
	for i, a := range last.Authorities {
		require.Equal(t, ledgerAuthority{Authority: a.ID, Capacity: a.Capacity, Reserved: a.Reserved, Charged: a.Charged, Pending: a.Pending, Free: a.Free,
			Balanced: true, Granted: a.Granted, Waited: a.Waited, OverBudget: a.OverBudget, Tickets: a.Tickets, Reclaimed: a.Freed, PressureEvents: a.PressureEvents},
			got.Ledger.Authorities[i])
	}
	require.Equal(t, want.Ledger, got.Ledger)
}

// svgDoc is the part of the page the test reads back with encoding/xml.
type element struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Title   string     `xml:"title"`
	Kids    []element  `xml:",any"`
}

func (e element) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (e element) walk(f func(element)) {
	f(e)
	for _, k := range e.Kids {
		k.walk(f)
	}
}

func parseValues(t *testing.T, s string) []memapi.Bytes {
	t.Helper()
	var out []memapi.Bytes
	for _, f := range strings.Fields(s) {
		v, err := strconv.ParseUint(f, 10, 64)
		require.NoError(t, err)
		out = append(out, memapi.Bytes(v))
	}
	return out
}

func parsePoints(t *testing.T, s string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, f := range strings.Fields(s) {
		x, y, ok := strings.Cut(f, ",")
		require.True(t, ok, f)
		xv, err1 := strconv.ParseFloat(x, 64)
		yv, err2 := strconv.ParseFloat(y, 64)
		require.NoError(t, err1)
		require.NoError(t, err2)
		out = append(out, [2]float64{xv, yv})
	}
	return out
}

func TestHTMLWellFormedOneSeriesPerHolder(t *testing.T) {
	rec, snaps := scenario(t)
	rec.Note("a <note> & more", "x")
	var buf bytes.Buffer
	require.NoError(t, rec.WriteHTML(&buf))
	page := buf.String()
	for _, banned := range []string{"<link", "@import", "url(http", "url(/", "src=", "href=\"http", "fetch(", "XMLHttpRequest"} {
		require.NotContains(t, page, banned, "the page must be self-contained")
	}
	for _, m := range regexp.MustCompile(`https?://[^"'\s)]*`).FindAllString(page, -1) {
		require.Contains(t, []string{"http://www.w3.org/1999/xhtml", "http://www.w3.org/2000/svg"}, m, "the only addresses are XML namespaces")
	}
	require.Contains(t, page, "test &lt;report&gt;")

	// The whole page is well-formed XML; every token parses strictly.
	dec := xml.NewDecoder(strings.NewReader(page))
	dec.Strict = true
	for {
		_, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	var root element
	require.NoError(t, xml.Unmarshal(buf.Bytes(), &root))
	var svgs []element
	root.walk(func(e element) {
		if e.XMLName.Local == "svg" {
			svgs = append(svgs, e)
		}
	})
	rep := rec.Report()
	require.Len(t, svgs, len(rep.Authorities))
	for i, svg := range svgs {
		tl := rep.Authorities[i]
		require.Equal(t, "http://www.w3.org/2000/svg", svg.XMLName.Space)
		require.Equal(t, string(tl.Authority), svg.attr("data-authority"))
		var holders, others []element
		var marks int
		var capLine element
		svg.walk(func(e element) {
			switch {
			case e.XMLName.Local == "polygon" && e.attr("data-kind") == "holder":
				holders = append(holders, e)
			case e.XMLName.Local == "polygon":
				others = append(others, e)
			case e.XMLName.Local == "polyline" && e.attr("class") == "cap":
				capLine = e
			case e.XMLName.Local == "line" && e.attr("class") == "mark" && e.attr("data-kind") != "":
				marks++
			}
		})
		require.Len(t, holders, len(tl.Holders), "one series per holder on %s", tl.Authority)
		seen := map[string]bool{}
		var prevVar memapi.Bytes
		for _, h := range holders {
			id := governor.HolderID(h.attr("data-holder"))
			_, ok := tl.Holder(id)
			require.True(t, ok, "series %q is a holder of %s", id, tl.Authority)
			require.False(t, seen[string(id)], "one series per holder")
			seen[string(id)] = true
			vals := parseValues(t, h.attr("data-values"))
			require.Len(t, vals, len(snaps))
			for k, s := range snaps {
				require.Equal(t, holderCharged(s, id, tl.Authority), vals[k])
			}
			require.Contains(t, h.Title, string(id))
			var variation memapi.Bytes
			for k := 1; k < len(vals); k++ {
				variation += max(vals[k], vals[k-1]) - min(vals[k], vals[k-1])
			}
			require.GreaterOrEqual(t, variation, prevVar, "the steadiest holder is stacked lowest")
			prevVar = variation
		}
		require.Len(t, others, 2)
		require.Equal(t, "pending", others[0].attr("data-kind"))
		require.Equal(t, "reserved", others[1].attr("data-kind"))
		require.Equal(t, tl.Capacity, parseValues(t, capLine.attr("data-values")))
		want := 0
		for _, e := range tl.Events {
			if marked(e.Kind) {
				want++
			}
		}
		require.Equal(t, want, marks, "a mark per event but the routine ones")

		// Geometry: the top edge of the last layer is the stacked total.
		s := newScale(tl)
		top := parsePoints(t, others[1].attr("points"))[:len(snaps)]
		for k, snap := range snaps {
			a := authorityOf(t, snap, tl.Authority)
			require.InDelta(t, s.x(tl.Times[k]), top[k][0], 0.06)
			require.InDelta(t, s.y(a.Reserved+a.Charged+a.Pending), top[k][1], 0.06, "sample %d", k)
			require.InDelta(t, s.y(a.Capacity-a.Free), top[k][1], 0.06, "the stack's top is capacity - free")
		}
	}
	// The ledger table matches the last snapshot.
	last := snaps[len(snaps)-1]
	var rows []element
	root.walk(func(e element) {
		if e.XMLName.Local == "table" && e.attr("class") == "ledger-holders" {
			e.walk(func(e element) {
				if e.XMLName.Local == "tr" && e.attr("data-holder") != "" {
					rows = append(rows, e)
				}
			})
		}
	})
	var n int
	for _, h := range last.Holders {
		for _, ha := range h.Authorities {
			require.Equal(t, string(h.ID), rows[n].attr("data-holder"))
			require.Equal(t, strconv.FormatUint(uint64(ha.Charged), 10), rows[n].attr("data-charged"))
			n++
		}
	}
	require.Len(t, rows, n)
}

func TestDecimationKeepsExactSamplesAndTheLast(t *testing.T) {
	rec := New(Options{MaxPoints: 4, MaxEvents: 3})
	t0 := time.Unix(1000, 0)
	const n = 23
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Second)
		rec.Sample(governor.Snapshot{
			Time:        at,
			Authorities: []governor.AuthoritySnapshot{{ID: "a", Capacity: 100, Charged: memapi.Bytes(i), Free: 100 - memapi.Bytes(i)}},
			Holders:     []governor.HolderSnapshot{{ID: "h", Authorities: []governor.HolderAuthoritySnapshot{{Authority: "a", Charged: memapi.Bytes(i)}}}},
		})
		rec.Event(governor.Event{Kind: governor.EventPressure, Time: at, Authority: "a", Holder: "h", Role: "kv", Bytes: memapi.Bytes(i)})
	}
	tl := rec.Report().Authorities[0]
	require.Equal(t, n, tl.Samples)
	require.LessOrEqual(t, len(tl.Times), 4+1)
	require.GreaterOrEqual(t, len(tl.Times), 3)
	h, _ := tl.Holder("h")
	require.Equal(t, "kv", h.Role)
	for i, sec := range tl.Times {
		// Every kept point is exactly the sample taken at that time.
		require.Equal(t, memapi.Bytes(sec), tl.Charged[i])
		require.Equal(t, memapi.Bytes(sec), h.Charged[i])
		if i > 0 {
			require.Greater(t, sec, tl.Times[i-1])
		}
	}
	require.Equal(t, float64(n-1), tl.Times[len(tl.Times)-1], "the last sample is kept")
	require.Equal(t, 0.0, tl.Times[0])
	require.LessOrEqual(t, len(tl.Events), 3)
	require.Equal(t, uint64(n), tl.EventCounts["pressure"])
	require.Equal(t, n, tl.EventsSeen)
	for _, e := range tl.Events {
		require.Equal(t, memapi.Bytes(e.Time), e.Bytes)
	}
}

func TestEmptyReportRenders(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, New(Options{}).WriteHTML(&buf))
	dec := xml.NewDecoder(&buf)
	dec.Strict = true
	for {
		_, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
}

func TestFormatBytes(t *testing.T) {
	for _, c := range []struct {
		n    memapi.Bytes
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {1536, "1.5 KiB"}, {96 << 20, "96 MiB"}, {9 << 29, "4.5 GiB"},
	} {
		require.Equal(t, c.want, FormatBytes(c.n))
	}
	require.Equal(t, memapi.Bytes(128<<20), niceCeil(101<<20))
	require.Equal(t, memapi.Bytes(100<<20), niceCeil(99<<20))
	require.Equal(t, memapi.Bytes(0), niceCeil(0))
	require.Equal(t, memapi.Bytes(5<<30), niceCeil(5<<30))
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0 ns", 830: "830 ns", 999: "999 ns", 1000: "1.00 µs", 12345: "12.3 µs", 123456: "123 µs",
		1234567: "1.23 ms", 45 * time.Millisecond: "45.0 ms", 2500 * time.Millisecond: "2.50 s", -1500: "-1.50 µs",
	} {
		require.Equal(t, want, FormatDuration(d), "%d ns", int64(d))
	}
}
