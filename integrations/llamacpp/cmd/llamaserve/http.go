package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/promgov"
	"github.com/memgen/memgen/integrations/llamacpp"
	"github.com/memgen/memgen/internal/procmem"
)

// serveConfig is what -listen serves.
type serveConfig struct {
	lib, model, listen string
	budget             memapi.Bytes // KV budget; 0 with ledger: the plan's KV cache at full context
	seqs, nCtx         int
	threads            int
	queue              time.Duration // a request's wait for a sequence and budget
	ledger             string        // a shared ledger to join ("": an authority of its own)
	join               time.Duration // with ledger: how long the load and the context's creation wait for others to give back
	stock              bool          // llama.cpp's own buffers, every sequence's n_ctx allocated at start
	sleepAfter         time.Duration // idle this long, the engine sleeps into the host tier (0: never)
	sleepLevel         int           // the sleep's level: 1 moves the weights to the host tier, 2 discards them (reloaded from the model file)
	sleepOnWant        bool          // sleep when the governor asks the weights for memory and no request runs
}

// serve runs the HTTP endpoint (llamacpp.Server) on cfg.listen until SIGINT
// or SIGTERM: the model's weights, and a KV budget for the requests
// decoding together, in one governed authority whose ledger /metrics
// exports. With a ledger the authority is a member of that shared ledger:
// the engine is planned first and refused (an *xproc.FitError, nothing
// joined) when it never fits; otherwise it joins, and its load waits up to
// cfg.join for other processes to give back what it needs. With stock,
// llama.cpp allocates its weights and every sequence's whole n_ctx of KV
// itself, as llama-server does, outside any ledger: the way engines are
// run today, served for comparison.
func serve(cfg serveConfig) error {
	if err := llamacpp.Init(cfg.lib); err != nil {
		return err
	}
	baseline()
	if cfg.stock && cfg.ledger != "" {
		return errors.New("-stock and -ledger: a stock engine allocates outside memgen, so it cannot join a ledger")
	}
	if cfg.stock && (cfg.sleepAfter > 0 || cfg.sleepOnWant) {
		return errors.New("-sleep-after or -sleep-on-want with -stock: a stock engine's weights are not in regions, so it cannot sleep")
	}
	budget := cfg.budget
	if cfg.ledger != "" {
		p, f, err := llamacpp.CheckLedger(cfg.ledger, cfg.model, llamacpp.PlanOptions{NCtx: cfg.nCtx, Sequences: cfg.seqs})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "llamaserve: ledger %s: %s: %s\n", cfg.ledger, f.Verdict, f.Reason)
		if budget == 0 {
			budget = p.KVFull
		}
	}
	h, err := newHost(cfg.ledger)
	if err != nil {
		return err
	}
	defer h.close()
	g := h.g
	ctx := context.Background()
	loadCtx, cancelLoad := context.WithTimeout(ctx, cfg.join)
	opts := llamacpp.Options{Manager: h.mgr, Governor: g, Device: h.key, Threads: cfg.threads, Name: "llama", Limit: h.limit, SleepOnPressure: cfg.sleepOnWant}
	if cfg.stock {
		opts = llamacpp.Options{Stock: true, Threads: cfg.threads}
	}
	if h.ledger != nil {
		// memctl show and watch see each sleep, wake, offload and restore,
		// and what the host tier holds after it.
		var stopNotes func()
		opts.OnMemoryEvent, stopNotes = tierNotes(h.ledger, g, "offload", opts.OnMemoryEvent)
		defer stopNotes()
	}
	defer cancelLoad()
	m, err := llamacpp.LoadModel(loadCtx, cfg.model, opts)
	if err != nil {
		return err
	}
	defer m.Close(ctx)
	sopts := llamacpp.ServerOptions{Sequences: cfg.seqs, NCtx: cfg.nCtx, Budget: budget, QueueTimeout: cfg.queue}
	if cfg.sleepAfter > 0 || cfg.sleepOnWant {
		if err := g.Register("llama/sleep", nil, governor.HolderOptions{}); err != nil {
			return err
		}
		if sopts.SleepTo, err = h.mgr.Bind("llama/sleep", "host-copy", h.offload); err != nil {
			return err
		}
		sopts.SleepAfter, sopts.SleepLevel, sopts.SleepOnPressure = cfg.sleepAfter, cfg.sleepLevel, cfg.sleepOnWant
	}
	// The context's creation waits, as the load did, within -join-timeout.
	s, err := llamacpp.NewServer(loadCtx, m, sopts)
	cancelLoad()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(promgov.NewCollector(g))
	srv := &http.Server{Handler: s.Handler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return errors.Join(err, s.Close(ctx))
	}
	kv := fmt.Sprintf("KV budget %d bytes", budget)
	if cfg.stock {
		kv = "stock: KV of every sequence allocated by llama.cpp"
	}
	fmt.Fprintf(os.Stderr, "llamaserve: serving %s on http://%s (%d sequences of %d tokens, %s)\n", cfg.model, ln.Addr(), cfg.seqs, cfg.nCtx, kv)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case <-stop:
	case err := <-served:
		return errors.Join(err, s.Close(ctx))
	}
	// Stop admitting (503), end the running requests, then the listener.
	closeCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = s.Close(closeCtx)
	return errors.Join(err, srv.Shutdown(closeCtx))
}

// baseline marks where the engine's memory is measured from, the library
// loaded and the model not yet: it collects the Go heap, resets the
// resident set's high-water mark and says what is resident, so that the
// mark's growth (VmHWM of /proc/PID/status, less this) is what the model,
// its buffers and its serving took at their peak.
func baseline() {
	u, err := procmem.Baseline()
	if err != nil {
		fmt.Fprintf(os.Stderr, "llamaserve: no baseline for the resident set: %v\n", err)
		return
	}
	fmt.Fprintf(os.Stderr, "llamaserve: resident %d bytes before the model (the baseline)\n", u.RSS)
}
