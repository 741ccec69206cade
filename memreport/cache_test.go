package memreport

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/stretchr/testify/require"
)

// poolHolder is a holder that reports a cache, as a caching pool does.
type poolHolder struct{ cached atomic.Uint64 }

func (*poolHolder) Reclaim(context.Context, governor.Ticket) (memapi.Bytes, error) { return 0, nil }

func (p *poolHolder) CachedBytes(memapi.AuthorityID) memapi.Bytes {
	return memapi.Bytes(p.cached.Load())
}

// cacheScenario samples a governor with a pool (whose cache grows and
// shrinks, and part of whose charge gets quarantined) beside a holder
// without a cache.
func cacheScenario(t *testing.T) (*Recorder, []governor.Snapshot) {
	t.Helper()
	clk := &manualClock{now: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)}
	rec := New(Options{Title: "cache"})
	g := governor.New(governor.Options{Clock: clk, OnEvent: rec.Event})
	t.Cleanup(func() { _ = g.Close() })
	require.NoError(t, g.AddAuthority("dev", 100*mib))
	pool := &poolHolder{}
	require.NoError(t, g.Register("pool", pool, governor.HolderOptions{Cache: true}))
	require.NoError(t, g.Register("weights", nil, governor.HolderOptions{Priority: 10}))
	rec.Label("pool", "workspace")
	charge := func(h governor.HolderID, n memapi.Bytes) governor.Lease {
		gr, err := g.Reserve(context.Background(), governor.Request{Authority: "dev", Holder: h, Role: "", Bytes: n})
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
	l := charge("pool", 32*mib)
	step()
	pool.cached.Store(uint64(20 * mib))
	step()
	require.NoError(t, l.Quarantine(4*mib))
	step()
	charge("weights", 40*mib)
	pool.cached.Store(uint64(8 * mib))
	step()
	rec.End(snaps[len(snaps)-1])
	return rec, snaps
}

func holderOf(t *testing.T, s governor.Snapshot, h governor.HolderID) governor.HolderAuthoritySnapshot {
	t.Helper()
	for _, hs := range s.Holders {
		if hs.ID == h {
			for _, ha := range hs.Authorities {
				return ha
			}
		}
	}
	return governor.HolderAuthoritySnapshot{}
}

// TestReportSplitsCharge: the timeline, the holder figures, the ledger and
// the page show each holder's charge as in use, cached and quarantined
// bytes, as the governor's snapshots say; the JSON conforms.
func TestReportSplitsCharge(t *testing.T) {
	rec, snaps := cacheScenario(t)
	rep := rec.Report()
	tl := rep.Authorities[0]
	pool, ok := tl.Holder("pool")
	require.True(t, ok)
	for i, s := range snaps {
		ha := holderOf(t, s, "pool")
		require.Equal(t, ha.Charged, pool.Charged[i])
		require.Equal(t, ha.Cached, pool.Cached[i], "sample %d", i)
		require.Equal(t, ha.Quarantined, pool.Quarantined[i])
		require.Equal(t, ha.InUse(), pool.InUse[i])
		require.Equal(t, pool.Charged[i], pool.InUse[i]+pool.Cached[i]+pool.Quarantined[i])
	}
	require.Equal(t, []memapi.Bytes{0, 0, 20 * mib, 20 * mib, 8 * mib}, pool.Cached)
	require.Equal(t, []memapi.Bytes{0, 32 * mib, 12 * mib, 8 * mib, 20 * mib}, pool.InUse)
	w, _ := tl.Holder("weights")
	require.Equal(t, w.Charged, w.InUse, "a holder without a cache: all in use")

	var st HolderStats
	for _, s := range tl.HolderStats {
		if s.Holder == "pool" {
			st = s
		}
	}
	require.Equal(t, HolderStats{Holder: "pool", Role: "workspace", Peak: 32 * mib, Mean: st.Mean, Final: 32 * mib,
		PeakCached: 20 * mib, FinalInUse: 20 * mib, FinalCached: 8 * mib, FinalQuarantined: 4 * mib}, st)

	var lh ledgerHolder
	for _, h := range rep.Ledger.Holders {
		if h.Holder == "pool" {
			lh = h
		}
	}
	require.Equal(t, memapi.Bytes(32*mib), lh.Charged)
	require.Equal(t, [3]memapi.Bytes{20 * mib, 8 * mib, 4 * mib}, [3]memapi.Bytes{lh.InUse, lh.Cached, lh.Quarantined})
	la := rep.Ledger.Authorities[0]
	require.Equal(t, [2]memapi.Bytes{8 * mib, 4 * mib}, [2]memapi.Bytes{la.Cached, la.Quarantined})

	var js bytes.Buffer
	require.NoError(t, rec.WriteJSON(&js))
	require.NoError(t, compileSchema(t).Validate(decode(t, js.Bytes())), js.String())

	// The chart: the pool is its bytes in use (and quarantined), then its
	// cache in its colour, paler; the stack's top is still the total.
	var buf bytes.Buffer
	require.NoError(t, rec.WriteHTML(&buf))
	var root element
	require.NoError(t, xml.Unmarshal(buf.Bytes(), &root))
	var layers []element
	root.walk(func(e element) {
		if e.XMLName.Local == "polygon" && e.attr("class") == "layer" {
			layers = append(layers, e)
		}
	})
	kinds := []string{}
	for _, l := range layers {
		kinds = append(kinds, l.attr("data-kind")+":"+l.attr("data-holder"))
	}
	require.Equal(t, []string{"holder:pool", "cached:pool", "holder:weights", "pending:", "reserved:"}, kinds, "the pool's charge is steadier")
	require.Equal(t, pool.Cached, parseValues(t, layers[1].attr("data-values")))
	for k, v := range parseValues(t, layers[0].attr("data-values")) {
		require.Equal(t, pool.Charged[k]-pool.Cached[k], v)
	}
	require.Equal(t, layers[0].attr("fill"), layers[1].attr("fill"), "the cache in its holder's colour")
	require.Equal(t, "0.4", layers[1].attr("fill-opacity"))
	s := newScale(tl)
	top := parsePoints(t, layers[4].attr("points"))[:len(snaps)]
	for k, snap := range snaps {
		a := authorityOf(t, snap, "dev")
		require.InDelta(t, s.y(a.Reserved+a.Charged+a.Pending), top[k][1], 0.06, "sample %d", k)
	}
	page := buf.String()
	require.Contains(t, page, `<tr data-holder="pool" data-charged="33554432" data-in-use="20971520" data-cached="8388608" data-quarantined="4194304">`)
	require.Contains(t, page, `<tr data-holder="pool" data-peak="33554432" data-final="33554432" data-in-use="20971520" data-cached="8388608" data-quarantined="4194304">`)
	require.Contains(t, page, `<tr data-authority="dev" data-cached="8388608" data-quarantined="4194304">`)
	require.Contains(t, page, `>pool (workspace) cached</text>`, "the legend names the cache")
	require.Contains(t, page, `<th>of it in use</th><th>cached</th><th>quarantined</th><th>peak cached</th>`)
	require.Contains(t, page, `<td>32 MiB</td><td>20 MiB</td><td>8 MiB</td><td>4 MiB</td><td>20 MiB</td></tr>`, "the pool's final charge, its split and its peak cache")
}

// TestTraceSplitsCharge: a holder's counter track stacks its bytes in use,
// cached and quarantined, which add up to its charge.
func TestTraceSplitsCharge(t *testing.T) {
	rec, snaps := cacheScenario(t)
	var buf bytes.Buffer
	require.NoError(t, rec.WriteTrace(&buf))
	var tr struct {
		TraceEvents []struct {
			Name string          `json:"name"`
			Ph   string          `json:"ph"`
			Args json.RawMessage `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &tr))
	var k int
	for _, e := range tr.TraceEvents {
		if e.Ph != "C" || e.Name != "holder pool" {
			continue
		}
		var args map[string]memapi.Bytes
		require.NoError(t, json.Unmarshal(e.Args, &args))
		ha := holderOf(t, snaps[k], "pool")
		require.Equal(t, map[string]memapi.Bytes{"in_use": ha.InUse(), "cached": ha.Cached, "quarantined": ha.Quarantined}, args, "sample %d", k)
		require.Equal(t, ha.Charged, args["in_use"]+args["cached"]+args["quarantined"])
		k++
	}
	require.Equal(t, len(snaps), k)
}

// TestReportCacheInChromium: the page's script draws the cache layer, reads
// it out at the cursor, and a holder switched off takes its cache with it.
func TestReportCacheInChromium(t *testing.T) {
	browser := chromium(t)
	rec, _ := cacheScenario(t)
	page := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(page)
	require.NoError(t, err)
	require.NoError(t, rec.WriteHTML(f))
	require.NoError(t, f.Close())
	dom := string(headless(t, browser, "file://"+page+"#cursor=3.5", 1200, 900, "--dump-dom"))
	live := regexp.MustCompile(`(?s)<svg[^>]*class="timeline live".*?</svg>`).FindString(dom)
	require.Regexp(t, `<polygon class="layer" data-kind="cached" data-holder="pool" fill="#[0-9a-f]+" fill-opacity="0.4"`, live)
	require.Regexp(t, `data-time="3.5">t = 3.5 s · [^<]*pool \(workspace\) cached 20 MiB · pool \(workspace\) 12 MiB · capacity 100 MiB`, dom)

	dom = string(headless(t, browser, "file://"+page+"#hide=pool", 1200, 900, "--dump-dom"))
	live = regexp.MustCompile(`(?s)<svg[^>]*class="timeline live".*?</svg>`).FindString(dom)
	require.NotContains(t, live, `data-holder="pool"`, "neither the pool's bytes in use nor its cache")
	require.Contains(t, live, `data-kind="holder" data-holder="weights"`)
}
