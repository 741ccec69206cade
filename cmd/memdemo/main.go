// Command memdemo is memgen's serving demo: it replays LLM requests from
// the Azure LLM inference trace 2023 against a device memory budget, with
// the whole memory system at work — the governor's ledger, the
// ProcessMemoryManager, the reference holders (a KV page store growing one
// token per decode step with a shared system prompt, and model residency
// stores, one of them a second model that is offloaded under pressure and
// reloaded on demand), an activation workspace whose caching pool is asked
// first under pressure, and the deferred-free queues — on the CPU mechanism
// by default, where every byte is real memory the kernel confirms.
//
// Simulated time drives the workload (arrivals from the trace, a step
// model for decode iterations); the memory operations are real. At every
// step the ledger identity is checked; every --audit-every steps the
// deferred frees are drained and the governor, the mechanisms and the
// kernel must agree to the byte, and written bytes are read back. At the
// end it prints a summary table, optionally compared with the baselines of
// the literature replayed on the same trace, budget and step model
// (--compare: static-max, static-pow2, static-oracle and paged), and writes
// a self-contained HTML memory report with its JSON snapshot and a
// trace-event export (--report).
//
//	memdemo                                      # the embedded excerpt, 160 MiB budget
//	memdemo --compare --report out/memory.html
//	memdemo --trace AzureLLMInferenceTrace_conv.csv --progress line
//	memdemo --metrics-addr localhost:9464 --speedup 20
//
// The exit status, with the same meanings as memgen's and memctl's, is 0
// when every request was served and every check passed, 1 when a check
// failed or the run could not complete (--mechanism cuda on a machine
// without CUDA fails here with the typed unavailable error), and 2 on a
// usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"sync/atomic"
	"time"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/promgov"
	"github.com/memgen/memgen/internal/clihelp"
	"github.com/memgen/memgen/memreport"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return clihelp.ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "memdemo: %v\nRun memdemo --help for the flags.\n", err)
		return clihelp.ExitUsage
	}
	o, systems, err := demo(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "memdemo: %v\n", err)
		return clihelp.ExitFailed
	}
	for _, c := range runChecks(o) {
		if !c.passed {
			fmt.Fprintf(stderr, "memdemo: %d check(s) failed, %d of %d requests served, %d leaked handles\n", o.Failures, o.Served, o.Requests, o.Leaks)
			return clihelp.ExitFailed
		}
	}
	for _, s := range systems {
		if s.Name == ReserveOracle.String() && o.PeakConcurrent < 2*s.PeakConcurrent {
			fmt.Fprintf(stderr, "memdemo: note: %d peak concurrent requests is less than twice static-oracle's %d at this budget\n", o.PeakConcurrent, s.PeakConcurrent)
		}
	}
	return clihelp.ExitOK
}

// demo runs the whole demo with cfg: it loads the trace, serves metrics if
// asked, replays the trace, runs the baselines if asked, prints the
// summary and writes the report.
func demo(ctx context.Context, cfg Config, stdout, stderr io.Writer) (*Outcome, []System, error) {
	reqs, name, err := LoadTrace(cfg.Trace, cfg.Requests)
	if err != nil {
		return nil, nil, err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rec := memreport.New(memreport.Options{Title: "memdemo memory report", TimeLabel: "simulated time (s)"})
	prog := newProgress(stderr, cfg.Progress)

	var systems []System
	if cfg.CompareStatic {
		systems = Baselines(cfg, reqs)
	}

	var metrics *lateSource
	if cfg.MetricsAddr != "" {
		// The collector reads the governor, which exists only once the run
		// has built the memory system: the run fills the source in.
		metrics = &lateSource{}
		stop, err := serveMetrics(cfg.MetricsAddr, metrics, stderr)
		if err != nil {
			return nil, nil, err
		}
		defer stop()
	}

	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, nil, err
		}
		defer pprof.StopCPUProfile()
	}
	o, err := Run(ctx, cfg, reqs, name, runHooks{rec: rec, prog: prog, log: log, metrics: metrics})
	prog.done()
	if err != nil && o == nil {
		return nil, nil, err
	}
	rows := summaryRows(cfg, o)
	writeSummary(stdout, rows, o, systems)
	if len(systems) > 0 {
		rec.Table(comparisonTable(o, systems))
	}
	if o.PoolSteps > 0 {
		rec.Table(poolTable(o))
	}
	for _, r := range rows {
		rec.Note(r.key, r.value)
	}
	for _, c := range runChecks(o) {
		rec.Check(c.label, c.passed, c.text)
	}
	rec.Data("run", newRunData(cfg, o, systems))
	if cfg.Report != "" {
		if werr := writeReport(cfg, rec); werr != nil {
			err = errors.Join(err, werr)
		} else {
			fmt.Fprintf(stdout, "memory report: %s (JSON: %s, trace events: %s)\n", cfg.Report, cfg.ReportJSON, cfg.ReportTrace)
		}
	}
	return o, systems, err
}

// lateSource is the metrics collector's view of a governor that does not
// exist yet when the server starts: until the run sets it, scrapes see an
// empty snapshot.
type lateSource struct {
	g atomic.Pointer[governor.Governor]
}

func (l *lateSource) set(g *governor.Governor) { l.g.Store(g) }

// Snapshot returns the governor's snapshot, or an empty one before the run.
func (l *lateSource) Snapshot() governor.Snapshot {
	if g := l.g.Load(); g != nil {
		return g.Snapshot()
	}
	return governor.Snapshot{}
}

func writeReport(cfg Config, rec *memreport.Recorder) error {
	for _, p := range []struct {
		path  string
		write func(io.Writer) error
	}{{cfg.Report, rec.WriteHTML}, {cfg.ReportJSON, rec.WriteJSON}, {cfg.ReportTrace, rec.WriteTrace}} {
		if dir := filepath.Dir(p.path); dir != "." {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
		}
		f, err := os.Create(p.path)
		if err != nil {
			return err
		}
		err = p.write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("writing %s: %w", p.path, err)
		}
	}
	return nil
}

// serveMetrics serves the governor's Prometheus metrics at addr until the
// returned stop is called; stop waits for the server to end.
func serveMetrics(addr string, src promgov.Source, stderr io.Writer) (func(), error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(promgov.NewCollector(src)); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "memdemo: metrics server: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "memdemo: serving Prometheus metrics at http://%s/metrics\n", ln.Addr())
	return func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(c)
		<-done
	}, nil
}
