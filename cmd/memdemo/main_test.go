package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/internal/clihelp"
	"github.com/memgen/memgen/memreport"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tinyConfig is a configuration small enough for a unit test whose budget
// still puts the KV store and the second model under pressure.
func tinyConfig(t *testing.T) Config {
	c := DefaultConfig()
	c.Requests = 200
	c.Budget = 6 << 20
	c.WeightBytes = 2 << 20
	c.SecondBytes = 1 << 20
	c.Shape = holders.ModelShape{Layers: 2, KVHeads: 2, HeadDim: 32, DTypeBytes: 2} // 512 B per token
	c.Granularity = 16 << 10
	c.PrefixTokens = 256
	c.SecondEvery = time.Second
	c.SecondHotFor = 100 * time.Millisecond
	c.AuditEvery = 25
	c.Progress = "off"
	dir := t.TempDir()
	c.Report = filepath.Join(dir, "report.html")
	require.NoError(t, c.validate())
	return c
}

func TestDemoEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end run")
	}
	cfg := tinyConfig(t)
	cfg.CompareStatic = true
	cfg.MaxContext = 4096 // two static-max reservations fit the 4 MiB of KV
	var stdout, stderr bytes.Buffer
	o, systems, err := demo(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err, stderr.String())
	t.Logf("\n%s", stdout.String())

	// Every request is served or rejected up front; none is lost.
	require.Equal(t, cfg.Requests, o.Requests)
	require.Equal(t, o.Requests, o.Served+o.Rejected)
	reqs, _, err := LoadTrace("", cfg.Requests)
	require.NoError(t, err)
	var kvRoom = cfg.kvRoom(roundTo(memapi.Bytes(cfg.PrefixTokens)*cfg.Shape.BytesPerToken(), cfg.Granularity))
	var wantTokens int64
	rejected := 0
	for _, q := range reqs {
		own := q.Context()
		if q.Prompt >= cfg.PrefixTokens {
			own -= cfg.PrefixTokens
		}
		if roundTo(memapi.Bytes(own)*cfg.Shape.BytesPerToken(), cfg.Granularity) > kvRoom {
			rejected++
			continue
		}
		wantTokens += int64(q.Gen)
	}
	require.Equal(t, rejected, o.Rejected)
	require.Equal(t, wantTokens, o.Tokens, "every served request generated exactly its tokens")
	require.Zero(t, o.Stalls)

	// The budget was under pressure, and the holders answered it.
	require.NotZero(t, o.PressureEvents)
	require.NotZero(t, o.Tickets)
	require.NotZero(t, o.Reclaimed)
	require.NotZero(t, o.Preemptions, "the KV store preempted requests")
	require.Equal(t, o.Preemptions, o.Resumed, "every preempted request was resumed")
	require.NotZero(t, o.Offloads, "the second model was offloaded")
	require.NotZero(t, o.Reloads, "and reloaded on demand")
	require.LessOrEqual(t, o.PeakCharged, cfg.Budget)
	require.NotZero(t, o.DeferredFrees)

	// The ledger identity held at every step; the audits agreed to the byte.
	require.Zero(t, o.Failures, "%q", o.FailureLog)
	require.Equal(t, 2*o.Steps, o.Checks, "two authorities checked at every step")
	require.GreaterOrEqual(t, o.KernelChecks, o.Steps/cfg.AuditEvery)
	require.True(t, o.HasKernel)
	require.Equal(t, o.UsedBeforeEnd, o.KernelBeforeEnd)
	require.NotZero(t, o.KernelBeforeEnd, "the weights and the prefix were still loaded at the last audit")
	require.Equal(t, o.UsedAtPeak, o.KernelAtPeak)
	require.NotZero(t, o.DataChecks)

	// Everything came back.
	require.Zero(t, o.UsedAfter)
	require.Zero(t, o.KernelAfter)
	require.Equal(t, o.CapacitiesAfter, o.FreeAfter)
	require.Zero(t, o.Leaks)

	// The activation workspace: a step's activations each step, its cache
	// asked first under pressure, its ledger audited, nothing after Close.
	requirePoolOutcome(t, o)

	// Every baseline ran on the same trace and budget.
	var names []string
	for _, s := range systems {
		names = append(names, s.Name)
		require.Equal(t, cfg.Requests, s.Requests, s.Name)
		require.Equal(t, s.Requests, s.Served+s.Rejected, s.Name)
		require.Greater(t, s.KVUtilMean, 0.0, s.Name)
		require.LessOrEqual(t, s.KVUtilMean, 1.0, s.Name)
	}
	require.Equal(t, []string{"static-max", "static-pow2", "static-oracle", "paged"}, names)
	// memgen commits its requests' tokens rounded up to a 16 KiB chunk (32
	// tokens here), the prefix once, and what waits for a fence: most of
	// its KV bytes hold tokens.
	require.Greater(t, o.KVUtilMean, 0.8)
	require.LessOrEqual(t, o.KVUtilMean, 1.0)
	require.LessOrEqual(t, o.KVUtilAtPeak, 1.0)

	// The summary table says it.
	out := stdout.String()
	for _, s := range []string{"requests served", "requests preempted", "peak charged", "tickets issued", "offloads / reloads",
		"deferred frees", "ledger identity", " 0 failures", "kernel-confirmed bytes", "KV utilisation", "static-max", "static-pow2",
		"static-oracle", "paged", "util@peak", "memgen ÷ baseline", "memory report: ", "activations", "caches first"} {
		require.Contains(t, out, s)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "memory report: ") {
			continue // a path
		}
		require.LessOrEqual(t, len([]rune(line)), summaryWidth, "summary line %q", line)
	}

	// The report: well-formed, one chart per authority, the final snapshot all free.
	page, err := os.ReadFile(cfg.Report)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(page))
	dec.Strict = true
	svgs := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "svg" {
			svgs++
		}
	}
	require.Equal(t, 2, svgs)
	js, err := os.ReadFile(cfg.ReportJSON)
	require.NoError(t, err)
	var rep memreport.Report
	require.NoError(t, json.Unmarshal(js, &rep))
	require.Len(t, rep.Authorities, 2)
	dev := rep.Authorities[0]
	require.Equal(t, memapi.AuthorityID("cpu:0"), dev.Authority, "the CPU mechanism's authority, not a generic device")
	for _, h := range []governor.HolderID{holderKV, holderModel, holderSecond, holderPool} {
		_, ok := dev.Holder(h)
		require.True(t, ok, "a series for %s", h)
	}
	// The pool's cache is drawn: the report saw it cached.
	poolStats := dev.HolderStats[slices.IndexFunc(dev.HolderStats, func(s memreport.HolderStats) bool { return s.Holder == holderPool })]
	require.NotZero(t, poolStats.PeakCached, "the activation pool's cache in the report")
	require.LessOrEqual(t, poolStats.PeakCached, o.Pool.PeakSegments)
	// The chart ends with everything closed and free; the ledger tables
	// show the end of the work, with the weights still loaded.
	for _, tl := range rep.Authorities {
		n := len(tl.Times) - 1
		require.Equal(t, tl.Capacity[n], tl.Capacity[n]-tl.Charged[n]-tl.Pending[n]-tl.Reserved[n])
		require.Zero(t, tl.Charged[n], "%s after close", tl.Authority)
	}
	require.True(t, rep.Ledger.Marked)
	var weights memapi.Bytes
	for _, h := range rep.Ledger.Holders {
		if h.Holder == holderModel && h.Authority == "cpu:0" {
			weights = h.Charged
		}
	}
	require.GreaterOrEqual(t, weights, cfg.WeightBytes, "the served model's weights at the end of the work")
	kvStats := dev.HolderStats[slices.IndexFunc(dev.HolderStats, func(s memreport.HolderStats) bool { return s.Holder == holderKV })]
	require.Equal(t, o.PeakKVBytes >= kvStats.Peak, true, "the KV peak at step ends is at least the charged peak")
	require.NotZero(t, kvStats.Mean)
	require.NotEmpty(t, rep.Notes)
	// The comparison with the baselines and the pool's figures are tables
	// at the top of the page, before the first chart; every ratio memgen ÷
	// baseline, the makespan's too.
	require.Len(t, rep.Tables, 2)
	cmp, pt := rep.Tables[0], rep.Tables[1]
	require.Equal(t, "comparison", cmp.Key)
	require.Len(t, cmp.Rows, 1+len(systems))
	require.Equal(t, "memgen", cmp.Rows[0][0])
	mk := slices.Index(cmp.Columns, "makespan")
	for i, s := range systems {
		want := fmt.Sprintf("%.2fx", o.SimTime.Seconds()/s.SimTime.Seconds())
		require.Equal(t, want, cmp.Rows[1+i][len(cmp.Columns)-1], "%s's makespan ratio, memgen ÷ it", s.Name)
		require.Equal(t, fmtDuration(s.SimTime), cmp.Rows[1+i][mk])
	}
	require.Equal(t, "activation_pool", pt.Key)
	var frag, lat bool
	for _, r := range pt.Rows {
		frag = frag || strings.HasPrefix(r[0], "peak held / peak requested") && strings.HasSuffix(r[1], fmt.Sprintf("= %.2f", o.Pool.PeakFragmentation()))
		lat = lat || strings.HasPrefix(r[0], "Alloc latency p50") && r[1] != ""
	}
	require.True(t, frag, "the pool's fragmentation in %q", pt.Rows)
	require.True(t, lat, "the pool's Alloc latencies in %q", pt.Rows)
	require.Equal(t, o.Pool.Allocs, uint64(o.PoolLatency.N), "every Alloc timed")
	require.Positive(t, o.PoolLatency.Max)
	require.LessOrEqual(t, o.PoolLatency.P50, o.PoolLatency.P99)
	htmlAt := bytes.Index(page, []byte(`data-key="comparison"`))
	require.Positive(t, htmlAt)
	require.Less(t, htmlAt, bytes.Index(page, []byte("<svg")), "the comparison before the charts")
	kinds := map[string]uint64{}
	for k, n := range dev.EventCounts {
		kinds[k] = n
	}
	require.Equal(t, o.Preemptions, kinds["preemption"], "every preemption is an event")
	require.Equal(t, o.Tickets, kinds["ticket"])
	require.NotZero(t, kinds["offload"])
	require.NotZero(t, kinds["reload"])

	// The snapshot conforms to its schema, and carries the figures as numbers.
	sch, err := jsonschema.NewCompiler().Compile("../../memreport/report.schema.json")
	require.NoError(t, err)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	require.NoError(t, err)
	require.NoError(t, sch.Validate(inst))
	var raw struct {
		Data struct {
			Run struct {
				Requests int `json:"requests"`
				Systems  []struct {
					Name       string  `json:"name"`
					KVUtilMean float64 `json:"kv_util_mean"`
					PeakRatio  float64 `json:"memgen_peak_concurrent_ratio"`
				} `json:"systems"`
			} `json:"run"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(js, &raw))
	require.Equal(t, cfg.Requests, raw.Data.Run.Requests)
	require.Len(t, raw.Data.Run.Systems, 5)
	require.Equal(t, "memgen", raw.Data.Run.Systems[0].Name)
	require.InDelta(t, o.KVUtilMean, raw.Data.Run.Systems[0].KVUtilMean, 1e-12)
	require.InDelta(t, 1.0, raw.Data.Run.Systems[0].PeakRatio, 1e-12)

	// The trace-event export: a span per served request, counters per holder.
	tr, err := os.ReadFile(cfg.ReportTrace)
	require.NoError(t, err)
	var trace memreport.Trace
	require.NoError(t, json.Unmarshal(tr, &trace))
	phases := map[string]int{}
	holderCounters := map[string]bool{}
	for _, e := range trace.TraceEvents {
		phases[e.Phase]++
		if e.Phase == "C" && strings.HasPrefix(e.Name, "holder ") {
			holderCounters[e.Name] = true
		}
	}
	require.Equal(t, o.Served, phases["X"], "a span per request")
	require.NotZero(t, phases["i"])
	require.Len(t, holderCounters, 4)
}

// requirePoolOutcome checks what a whole run says of its activation pool.
func requirePoolOutcome(t *testing.T, o *Outcome) {
	t.Helper()
	require.Equal(t, uint64(o.Steps), o.PoolSteps, "every decode step took its activations from the pool")
	p := o.Pool
	require.NotZero(t, p.PeakInUse)
	require.GreaterOrEqual(t, p.PeakSegments, p.PeakInUse)
	require.Equal(t, o.PoolLargest, p.PeakInUse, "the largest step is the pool's peak in use")
	require.Zero(t, p.InUse, "no activation outlives its step")
	require.Zero(t, p.OverBudget)
	require.Equal(t, o.KernelChecks, o.PoolAudits, "every full audit checked the pool's ledger")
	// Caches first: the pool's cache answered pressure before any
	// request was preempted or weight offloaded, and alone in some rounds.
	f := o.PoolPressure
	require.Zero(t, f.Violations, "%q", f.ViolationLog)
	require.Equal(t, int(o.PressureEvents), f.Rounds, "a round per pressure event on the device")
	require.NotZero(t, f.PoolFirst)
	require.NotZero(t, f.PoolAlone, "the pool's cache alone answered some pressure")
	require.Equal(t, f.Rounds, f.PoolFirst+f.PoolEmpty+f.NoTicket)
	require.NotZero(t, p.Reclaims)
	require.NotZero(t, p.Reclaimed)
	require.Equal(t, p.Reclaimed, f.PoolFreed, "what the pool gave back is what the governor saw it give")
	require.Zero(t, o.PoolAfter.Segments)
	require.Zero(t, o.PoolAfter.Quarantined)
}

func TestInterruptedRunReturnsEverything(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Requests = 0 // the whole excerpt: far longer than the deadline
	cfg.Report = ""
	// The deadline runs from when the memory system is built (the run
	// hands its governor to the metrics source then), so a loaded machine
	// building it slowly still interrupts the replay, not the building.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	built := &lateSource{}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for built.g.Load() == nil {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		select {
		case <-stop:
		case <-time.After(300 * time.Millisecond):
			cancel(context.DeadlineExceeded)
		}
	}()
	reqs, name, err := LoadTrace("", 0)
	require.NoError(t, err)
	o, err := Run(ctx, cfg, reqs, name, runHooks{metrics: built})
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, context.Cause(ctx), context.DeadlineExceeded)
	require.NotNil(t, o)
	require.Less(t, o.Served, o.Requests)
	require.Zero(t, o.Failures, "%q", o.FailureLog)
	require.NotZero(t, o.PoolSteps, "the activation pool served steps before the interruption")
	require.Zero(t, o.PoolAfter.Segments)
	require.Zero(t, o.PoolAfter.InUse)
	require.Zero(t, o.UsedAfter)
	require.Zero(t, o.KernelAfter)
	require.Equal(t, o.CapacitiesAfter, o.FreeAfter)
}

func roundTo(n, g memapi.Bytes) memapi.Bytes { return (n + g - 1) / g * g }

func TestRunExitStatus(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"--budget", "lots"}, &out, &errb))
	require.Contains(t, errb.String(), "lots")
	errb.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"--metrics-addr", "0.0.0.0:9464"}, &out, &errb))
	require.Contains(t, errb.String(), "loopback")
	errb.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"--budget", "64MiB", "--weights", "64MiB"}, &out, &errb))
	require.Contains(t, errb.String(), "no room for KV")
	errb.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"extra"}, &out, &errb))
	errb.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"--help"}, &out, &errb))
	require.Contains(t, out.String(), "-compare-static")
	require.Contains(t, out.String(), clihelp.ExitCodes, "the exit codes memgen and memctl document too")
	errb.Reset()
	none := filepath.Join(t.TempDir(), "none.csv")
	require.Equal(t, 1, run(context.Background(), []string{"--trace", none}, &out, &errb))
	require.Contains(t, errb.String(), "--trace "+none+": not found")
	require.NotContains(t, errb.String(), "shared/traces", "only the path given")
}

// TestCommandLineMessages: help goes to stdout and nothing to stderr; a
// usage error is printed once, on stderr, naming only the offending flag
// (with its value and unit), followed by one line saying where the flags
// are, never the whole help.
func TestCommandLineMessages(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"--help"}, &out, &errb))
	require.Contains(t, out.String(), "Usage: memdemo [flags]")
	require.Empty(t, errb.String())
	for _, line := range strings.Split(out.String(), "\n") {
		require.LessOrEqual(t, len(line), 80, "a help line wider than 80 columns: %q", line)
	}
	require.Contains(t, out.String(), "  -budget bytes\n", "the flags as flag.PrintDefaults lists them")
	for _, tc := range []struct {
		args     []string
		want     string
		notNamed []string
	}{
		{[]string{"--bogus"}, "memdemo: flag provided but not defined: -bogus\n", nil},
		{[]string{"--requests", "-5"}, "memdemo: --requests -5: must not be negative\n", []string{"--prefix-tokens", "--speedup", "--audit-every", "--second-every"}},
		{[]string{"--second-hot-for", "-1s"}, "memdemo: --second-hot-for -1s: must not be negative\n", []string{"--requests"}},
		{[]string{"--step-per-seq", "-1ms"}, "memdemo: --step-per-seq -1ms: must not be negative\n", []string{"--step-base"}},
		{[]string{"--budget", "100"}, "memdemo: --budget 100B: the weights (--weights 64MiB + --second-weights 32MiB) leave no room for KV", nil},
		{[]string{"--budget", "0"}, "memdemo: --budget 0: must be positive", nil},
		{[]string{"--authority", "host"}, "memdemo: --authority \"host\": the host's authority (the offload target) has that name", nil},
	} {
		out.Reset()
		errb.Reset()
		require.Equal(t, 2, run(context.Background(), tc.args, &out, &errb), "%q", tc.args)
		got := errb.String()
		require.True(t, strings.HasPrefix(got, tc.want), "%q: got %q, want it to start with %q", tc.args, got, tc.want)
		require.True(t, strings.HasSuffix(got, "\nRun memdemo --help for the flags.\n"), "%q: %q", tc.args, got)
		require.Equal(t, 2, strings.Count(got, "\n"), "%q: one error line and the hint: %q", tc.args, got)
		require.NotContains(t, got, "Usage:", "%q", tc.args)
		require.Empty(t, out.String(), "%q", tc.args)
		for _, n := range tc.notNamed {
			require.NotContains(t, got, n, "%q", tc.args)
		}
	}
}

func TestCUDAUnavailableIsTyped(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Mechanism = "cuda"
	cfg.Requests = 5
	var stdout, stderr bytes.Buffer
	o, _, err := demo(context.Background(), cfg, &stdout, &stderr)
	if err == nil {
		require.Zero(t, o.Failures, "CUDA is present here: the run must pass")
		return
	}
	require.ErrorIs(t, err, memapi.ErrUnavailable)
	require.Contains(t, err.Error(), "--mechanism cuda")
	require.Equal(t, 1, run(context.Background(), []string{"--mechanism", "cuda", "--requests", "5", "--progress", "off"}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "unavailable")
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]memapi.Bytes{
		"4096": 4096, "64K": 64 << 10, "64KiB": 64 << 10, "512MiB": 512 << 20, "1.5GiB": 3 << 29, "2g": 2 << 30, "7B": 7, " 3 MiB ": 3 << 20,
	} {
		got, err := parseSize(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "-1", "1XB", "MiB", "1e30"} {
		_, err := parseSize(in)
		require.Error(t, err, in)
	}
	require.Equal(t, "160MiB", formatSize(160<<20))
	require.Equal(t, "1536B", formatSize(1536))
	require.Equal(t, "0", formatSize(0))
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"--budget", "1GiB", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype-bytes", "2",
		"--report", "out/r.html", "--metrics-addr", "localhost:0", "--compare-static"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, memapi.Bytes(1<<30), c.Budget)
	require.Equal(t, memapi.Bytes(131072), c.Shape.BytesPerToken(), "a Llama-3-8B-like shape")
	require.Equal(t, "out/r.json", c.ReportJSON)
	require.Equal(t, c.Budget/100, c.Watermark)
	require.Equal(t, c.WeightBytes+c.SecondBytes, c.HostBudget)
	require.True(t, c.CompareStatic)
	for _, args := range [][]string{
		{"--mechanism", "tpu"}, {"--progress", "fancy"}, {"--layers", "0"}, {"--speedup", "-1"}, {"--step-base", "0s"}, {"--metrics-addr", "nohost"},
	} {
		_, err := parseFlags(args, io.Discard)
		require.ErrorIs(t, err, ErrUsage, "%q", args)
	}
}

func TestMetricsServer(t *testing.T) {
	g := governor.New(governor.Options{})
	defer g.Close()
	require.NoError(t, g.AddAuthority("device", 1<<20))
	src := &lateSource{}
	require.Empty(t, src.Snapshot().Authorities, "before the run, an empty snapshot")
	src.set(g)
	var stderr bytes.Buffer
	stop, err := serveMetrics("127.0.0.1:0", src, &stderr)
	require.NoError(t, err)
	defer stop()
	line := strings.TrimSpace(stderr.String())
	require.Contains(t, line, "http://127.0.0.1:")
	url := line[strings.Index(line, "http://"):]
	resp, err := http.Get(url)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), `memgen_governor_capacity_bytes{authority="device"} 1.048576e+06`)
	stop()
	_, err = http.Get(url)
	require.Error(t, err, "the server is gone after stop")
}

func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, "auto")
	require.Equal(t, "line", p.mode, "a buffer is not a terminal")
	now := time.Unix(0, 0)
	p.now = func() time.Time { return now }
	s := progressState{done: 0, total: 10, running: 2, sim: 3 * time.Second, charged: 1 << 20, capacity: 4 << 20}
	p.update(s)
	now = now.Add(time.Second)
	s.done = 5
	p.update(s) // not due: one line every few seconds
	require.Equal(t, 1, strings.Count(buf.String(), "\n"))
	require.Contains(t, buf.String(), "0/10 requests, ETA -, 2 running")
	now = now.Add(5 * time.Second)
	p.update(s)
	// 5 of 10 in 6 s: 6 s to go.
	require.Contains(t, buf.String(), "5/10 requests, ETA 6s, 2 running")

	// A bar: one line rewritten in place, cut to the terminal's width so
	// it never wraps, with the estimate.
	for _, width := range []int{200, 80, 60, 40, 20} {
		buf.Reset()
		p = newProgress(&buf, "bar")
		p.width = func() int { return width }
		now = time.Unix(0, 0)
		p.now = func() time.Time { return now }
		big := progressState{total: 19366, running: 58, waiting: 1234, preempted: 1907, sim: 68 * time.Minute, charged: 159 << 20, capacity: 160 << 20}
		for i := 0; i <= 20; i++ {
			big.done = i * 19366 / 20
			p.update(big)
			now = now.Add(time.Second)
		}
		p.done()
		out := buf.String()
		require.Equal(t, 1, strings.Count(out, "\n"), "only the end of the run ends the line")
		require.True(t, strings.HasSuffix(out, "\n"))
		for _, draw := range strings.Split(strings.TrimSuffix(out, "\n"), "\r")[1:] {
			line := strings.TrimSuffix(draw, "\033[K")
			require.LessOrEqual(t, len(line), width-1, "width %d: %q", width, line)
			if width >= 60 {
				require.Regexp(t, `^\[[#.]{10,30}\] +\d+%  \d+/19366 requests  (ETA \S+|done)`, line, "width %d", width)
			}
		}
		if width >= 80 {
			require.Contains(t, out, "ETA 10s", "half done after 10 s")
			require.Contains(t, out, "100%  19366/19366 requests  done")
		}
	}

	buf.Reset()
	p = newProgress(&buf, "off")
	p.update(s)
	p.done()
	require.Empty(t, buf.String())
}

func TestSimClockTimers(t *testing.T) {
	c := newSimClock(simEpoch)
	fired := make(chan int, 3)
	c.AfterFunc(2*time.Second, func() { fired <- 2 })
	stopped := c.AfterFunc(time.Second, func() { fired <- 1 })
	require.True(t, stopped())
	require.False(t, stopped())
	c.Advance(1500 * time.Millisecond)
	c.Close()
	require.Empty(t, fired)
	c.Advance(time.Second)
	c.Close()
	require.Equal(t, 2, <-fired)
	require.Equal(t, simEpoch.Add(2500*time.Millisecond), c.Now())
}

func TestStackFailsCleanly(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Granularity = 3000 // not a power of two
	_, err := newStack(context.Background(), cfg, memreport.New(memreport.Options{}), nil)
	require.ErrorIs(t, err, memapi.ErrInvalidSize)
	require.Contains(t, err.Error(), "--granularity")
	require.False(t, errors.Is(err, memapi.ErrUnavailable))
}

// TestAnyTraceWithTheColumnsRuns replays a trace file of another service
// in the same format (columns in another order, an extra one), as --trace
// does with the Azure code trace.
func TestAnyTraceWithTheColumnsRuns(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Requests = 0
	cfg.Report = ""
	cfg.CompareStatic = true
	cfg.MaxContext = 4096
	var b strings.Builder
	b.WriteString("ContextTokens,GeneratedTokens,TIMESTAMP,Service\n")
	for i := range 30 {
		fmt.Fprintf(&b, "%d,%d,2023-11-16 18:00:%02d.25,code\n", 200+50*i, 5+i%7, i)
	}
	cfg.Trace = filepath.Join(t.TempDir(), "code.csv")
	require.NoError(t, os.WriteFile(cfg.Trace, []byte(b.String()), 0o644))
	var stdout, stderr bytes.Buffer
	o, systems, err := demo(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err, stderr.String())
	require.Equal(t, 30, o.Requests)
	require.Equal(t, 30, o.Served+o.Rejected)
	require.Zero(t, o.Failures, "%q", o.FailureLog)
	require.Len(t, systems, 4)
	for _, s := range systems {
		require.Equal(t, 30, s.Served+s.Rejected, s.Name)
	}
	require.Equal(t, cfg.Trace, o.TraceName)
	require.Contains(t, stdout.String(), "30 requests")
}

// The device's authority is named as the user names it (--authority), and
// by its mechanism by default: the report's charts and tables say so.
func TestAuthorityNamedAsTheUserNamedIt(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "r.html")
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--requests", "20", "--progress", "off", "--authority", "gpu-a", "--report", report}, &out, &errb)
	require.Equal(t, 0, code, "%s\n%s", out.String(), errb.String())
	page, err := os.ReadFile(report)
	require.NoError(t, err)
	require.Contains(t, string(page), "<h2>Authority gpu-a</h2>")
	require.NotContains(t, string(page), "Authority device")
	js, err := os.ReadFile(filepath.Join(dir, "r.json"))
	require.NoError(t, err)
	var rep memreport.Report
	require.NoError(t, json.Unmarshal(js, &rep))
	var ids []memapi.AuthorityID
	for _, a := range rep.Authorities {
		ids = append(ids, a.Authority)
	}
	require.Equal(t, []memapi.AuthorityID{"gpu-a", "host"}, ids)
}
