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
	"github.com/memgen/memgen/governor/promgov"
	"github.com/memgen/memgen/integrations/llamacpp"
)

// serve runs the HTTP endpoint (llamacpp.Server) on listen until SIGINT or
// SIGTERM: the model's weights, and a KV budget of budget bytes for the
// requests decoding together, in one governed authority whose ledger
// /metrics exports. With ledger set the authority is a member of that
// shared ledger: the engine is planned first and refused (a
// *llamacpp.FitError, nothing joined) when it never fits; otherwise it
// joins, and its load waits up to join for other processes to give back
// what it needs. budget 0 is the plan's KV cache at full context.
func serve(lib, model, listen string, budget memapi.Bytes, seqs, nCtx, threads int, queue time.Duration, ledger string, join time.Duration) error {
	if err := llamacpp.Init(lib); err != nil {
		return err
	}
	if ledger != "" {
		p, f, err := llamacpp.CheckLedger(ledger, model, llamacpp.PlanOptions{NCtx: nCtx, Sequences: seqs})
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "llamaserve: ledger %s: %s: %s\n", ledger, f.Verdict, f.Reason)
		if budget == 0 {
			budget = p.KVFull
		}
	}
	h, err := newHost(ledger)
	if err != nil {
		return err
	}
	defer h.close()
	g := h.g
	ctx := context.Background()
	loadCtx, cancelLoad := context.WithTimeout(ctx, join)
	m, err := llamacpp.LoadModel(loadCtx, model, llamacpp.Options{Manager: h.mgr, Governor: g, Device: h.key, Threads: threads, Name: "llama", Limit: h.limit})
	cancelLoad()
	if err != nil {
		return err
	}
	defer m.Close(ctx)
	s, err := llamacpp.NewServer(m, llamacpp.ServerOptions{Sequences: seqs, NCtx: nCtx, Budget: budget, QueueTimeout: queue})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(promgov.NewCollector(g))
	srv := &http.Server{Handler: s.Handler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return errors.Join(err, s.Close(ctx))
	}
	fmt.Fprintf(os.Stderr, "llamaserve: serving %s on http://%s (%d sequences of %d tokens, KV budget %d bytes)\n", model, ln.Addr(), seqs, nCtx, budget)
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
