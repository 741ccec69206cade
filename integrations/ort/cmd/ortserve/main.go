// Command ortserve serves an ONNX Runtime decoder (the layout
// ort.NewDecoder takes: scripts/ort.sh builds one) over HTTP, each request
// a sequence of its own whose KV cache grows, through the governor, a
// token at a time (ort.KVGrow), the session's weights and activations in
// a workspace allocator charged beside it:
//
//   - POST /v1/completions: {"prompt": [token ids], "max_tokens": N}, the
//     greedy tokens answered as {"choices": [{"tokens": [...]}]};
//   - GET /stats: requests served, failed and refused, the sequences
//     running now and at the peak, the KV budget and the part admitted;
//   - GET /health, and GET /metrics: the governor's ledger (promgov).
//
// Up to -sequences requests run at once (one ONNX Runtime Run per token
// each); a request is admitted when a sequence is free and the KV of its
// prompt and max_tokens fits the KV budget beside the running ones',
// within -queue, and refused with 429 and Retry-After otherwise. With
// -ledger PATH the governor's authority joins that shared ledger (memctl
// create) instead of holding a capacity of its own: every byte of the
// engine is charged there beside the other processes'. The engine is
// planned first (ort.PlanDecoder, the plan ortplan prints): a ledger
// whose capacity is below the plan's start (the weights among it) refuses
// it, an *xproc.FitError saying why (exit status 3, nothing joined); one
// whose free bytes must first be given back by others is joined, and each
// allocation of the session (the weights while it loads) waits up to
// -join-timeout (30 s) for them.
//
//	ortserve -lib LIBONNXRUNTIME -model DECODER.onnx -listen 127.0.0.1:8083 [-sequences 16] [-nctx 1024] [-budget BYTES] [-queue 2s] [-ledger PATH [-join-timeout 30s]]
//
// With -preallocate each sequence's KV cache is preallocated for -nctx
// tokens instead (ort.KVPreallocated: ONNX Runtime GenAI's max-length
// buffer), the baseline of the many-engines scenario.
//
// Exit codes, as memgen's, memctl's and memdemo's: 0 served until SIGTERM
// or SIGINT, 1 a failure, 2 a usage error, 3 refused by the ledger.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/promgov"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/ort"
	"github.com/memgen/memgen/internal/procmem"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

func main() {
	lib := flag.String("lib", os.Getenv("MEMGEN_ORT_LIB"), "libonnxruntime (scripts/ort.sh prints it)")
	model := flag.String("model", os.Getenv("MEMGEN_ORT_DECODER_MODEL"), "a decoder ONNX model in ort.NewDecoder's layout")
	listen := flag.String("listen", "127.0.0.1:8083", "the address to serve on (port 0: any; the address is printed)")
	seqs := flag.Int("sequences", 16, "requests decoded at once, each a sequence of its own")
	nCtx := flag.Int("nctx", 1024, "the most tokens of one request, prompt and completion")
	budget := flag.Int64("budget", 0, "the KV bytes the running requests may hold together (0: -sequences at -nctx)")
	queue := flag.Duration("queue", 2*time.Second, "how long a request waits for a sequence and budget before a 429")
	ledger := flag.String("ledger", "", "join this shared ledger (memctl create) instead of a capacity of its own")
	join := flag.Duration("join-timeout", 30*time.Second, "with -ledger: how long one allocation of the session (its weights while loading, a step's\nactivations) waits for other processes to give memory back")
	prealloc := flag.Bool("preallocate", false, "ONNX Runtime GenAI's layout instead: each sequence's KV cache preallocated for -nctx tokens\n(ort.KVPreallocated), a request's need its full -nctx")
	flag.Parse()
	if flag.NArg() > 0 || *lib == "" || *model == "" || *seqs < 1 || *nCtx < 2 {
		fmt.Fprintln(os.Stderr, "ortserve: -lib and -model are required (or MEMGEN_ORT_LIB and MEMGEN_ORT_DECODER_MODEL), -sequences ≥ 1, -nctx ≥ 2, and no arguments")
		os.Exit(2)
	}
	if err := serve(*lib, *model, *listen, memapi.Bytes(*budget), *seqs, *nCtx, *queue, *ledger, *join, *prealloc); err != nil {
		fmt.Fprintln(os.Stderr, "ortserve:", err)
		var fe *xproc.FitError
		if errors.As(err, &fe) {
			os.Exit(3) // refused: it never fits the ledger, nothing joined
		}
		os.Exit(1)
	}
}

// engine is the decoder and what it runs on.
type engine struct {
	d        *ort.Decoder
	g        *governor.Governor
	kvPerTok memapi.Bytes // one token's rows in every cache tensor
	nCtx     int
	prealloc bool // each sequence holds nCtx rows from its start
	budget   memapi.Bytes
	queue    time.Duration

	mu      sync.Mutex
	free    int           // free sequences
	used    memapi.Bytes  // KV budget of the admitted requests
	changed chan struct{} // closed and replaced when a sequence or budget is released
	closing bool
	stats   stats
	running sync.WaitGroup
}

// stats is GET /stats (the field names llamaserve's /stats has).
type stats struct {
	Served, Failed, Refused int64
	Running, Peak           int
	Sequences               int
	Budget, Admitted        memapi.Bytes
}

func serve(lib, model, listen string, budget memapi.Bytes, seqs, nCtx int, queue time.Duration, ledger string, join time.Duration, prealloc bool) error {
	if err := ort.Init(lib, ort.InitOptions{Quiet: true}); err != nil {
		return err
	}
	if err := ort.WarmUp(); err != nil {
		return err
	}
	baseline()
	g := governor.New(governor.Options{})
	defer g.Close()
	var l *xproc.Ledger
	if ledger == "" {
		if err := g.AddAuthority("host", 1<<40); err != nil {
			return err
		}
	} else {
		mode := ort.KVGrow
		if prealloc {
			mode = ort.KVPreallocated
		}
		p, err := ort.PlanDecoder(model, ort.PlanOptions{NCtx: nCtx, Sequences: seqs, Mode: mode})
		if err != nil {
			return err
		}
		if _, err := xproc.CheckFit(ledger, model, p.Need()); err != nil {
			return err
		}
		if l, err = xproc.Open(ledger, xproc.Options{}); err != nil {
			return err
		}
		defer l.Close()
		if err := l.Bind(g, "host"); err != nil {
			return err
		}
	}
	mech, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: "host"})
	if err != nil {
		return err
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = mgr.Close(ctx)
		_ = ectx.Close(ctx, true)
	}()
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: mech, Context: ectx, Authority: "host"}); err != nil {
		return err
	}
	wsBind, err := mgr.Bind("ort/session", "workspace", host)
	if err != nil {
		return err
	}
	wsOpts := ort.Options{}
	if ledger != "" {
		// On a shared ledger the room may be held by other processes: an
		// allocation waits for them to give it back (the ledger's wants
		// ask their holders), up to -join-timeout.
		wsOpts.Wait = join
	}
	ws, err := ort.NewAllocator(wsBind, wsOpts)
	if err != nil {
		return err
	}
	defer ws.Close()
	if err := g.Register("ort/session", ws, governor.HolderOptions{Cache: true}); err != nil {
		return err
	}
	if err := g.Register("ort/kv", nil, governor.HolderOptions{}); err != nil {
		return err
	}
	kvBind, err := mgr.Bind("ort/kv", "kv-cache", host)
	if err != nil {
		return err
	}
	mode := ort.KVGrow
	if prealloc {
		mode = ort.KVPreallocated
	}
	d, err := ort.NewDecoder(model, kvBind, ort.DecoderOptions{Mode: mode, MaxSeq: nCtx, Workspace: ws})
	if err != nil {
		return err
	}
	defer d.Close()
	e := &engine{d: d, g: g, nCtx: nCtx, queue: queue, free: seqs, changed: make(chan struct{}), prealloc: prealloc,
		kvPerTok: d.RowBytes() * memapi.Bytes(d.Tensors())}
	e.stats.Sequences = seqs
	e.budget = budget
	if e.budget == 0 {
		e.budget = memapi.Bytes(seqs*nCtx) * e.kvPerTok
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(promgov.NewCollector(g))
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", e.complete)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, e.snapshot()) })
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "ortserve: serving %s on http://%s (%d sequences of %d tokens, KV budget %d bytes)\n", model, ln.Addr(), seqs, nCtx, e.budget)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(stop)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case <-stop:
	case err := <-served:
		return err
	}
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = srv.Shutdown(ctx)
	e.running.Wait()
	return err
}

func (e *engine) snapshot() stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stats
	st.Running = st.Sequences - e.free
	st.Budget, st.Admitted = e.budget, e.used
	return st
}

// admit waits, up to the queue timeout, for a free sequence and room for
// need in the KV budget.
func (e *engine) admit(ctx context.Context, need memapi.Bytes) bool {
	deadline := time.NewTimer(e.queue)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		if !e.closing && e.free > 0 && e.used+need <= e.budget {
			e.free--
			e.used += need
			if running := e.stats.Sequences - e.free; running > e.stats.Peak {
				e.stats.Peak = running
			}
			e.running.Add(1)
			e.mu.Unlock()
			return true
		}
		changed := e.changed
		if e.closing {
			e.mu.Unlock()
			return false
		}
		e.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (e *engine) release(need memapi.Bytes, ok bool) {
	e.mu.Lock()
	e.free++
	e.used -= need
	if ok {
		e.stats.Served++
	} else {
		e.stats.Failed++
	}
	close(e.changed)
	e.changed = make(chan struct{})
	e.mu.Unlock()
	e.running.Done()
}

func (e *engine) complete(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt    []int64 `json:"prompt"`
		MaxTokens int     `json:"max_tokens"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || json.Unmarshal(body, &req) != nil {
		writeError(w, http.StatusBadRequest, "the body is not a JSON completion request", "")
		return
	}
	vocab := int64(e.d.Vocab())
	if len(req.Prompt) == 0 {
		writeError(w, http.StatusBadRequest, "prompt: want at least one token id", "prompt")
		return
	}
	for _, t := range req.Prompt {
		if t < 0 || t >= vocab {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("prompt: token %d is not in the vocabulary of %d", t, vocab), "prompt")
			return
		}
	}
	if req.MaxTokens < 1 || len(req.Prompt)+req.MaxTokens > e.nCtx {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("max_tokens: %d with a prompt of %d must be at least 1 and fit n_ctx %d", req.MaxTokens, len(req.Prompt), e.nCtx), "max_tokens")
		return
	}
	rows := len(req.Prompt) + req.MaxTokens
	if e.prealloc {
		rows = e.nCtx
	}
	need := memapi.Bytes(rows) * e.kvPerTok
	if need > e.budget {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the request needs %d bytes of KV; the budget is %d", need, e.budget), "max_tokens")
		return
	}
	if !e.admit(r.Context(), need) {
		e.mu.Lock()
		e.stats.Refused++
		closing := e.closing
		e.mu.Unlock()
		if closing {
			writeError(w, http.StatusServiceUnavailable, "the server is closing", "")
			return
		}
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(e.queue/time.Second))))
		writeError(w, http.StatusTooManyRequests, "every sequence is busy or the KV budget is held: retry later", "")
		return
	}
	toks, err := e.decode(r.Context(), req.Prompt, req.MaxTokens)
	e.release(need, err == nil)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error(), "")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object":  "text_completion",
		"model":   "ort",
		"choices": []map[string]any{{"index": 0, "tokens": toks, "finish_reason": "length"}},
		"usage":   map[string]int{"prompt_tokens": len(req.Prompt), "completion_tokens": len(toks), "total_tokens": len(req.Prompt) + len(toks)},
	})
}

// decode runs one sequence: the prompt a token per Run, then n greedy
// tokens.
func (e *engine) decode(ctx context.Context, prompt []int64, n int) (out []int64, err error) {
	q, err := e.d.NewSequence(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, q.Close()) }()
	var logits []float32
	for _, t := range prompt {
		if logits, err = q.Step(ctx, t); err != nil {
			return nil, err
		}
	}
	for len(out) < n {
		next := int64(argmax(logits))
		out = append(out, next)
		if len(out) == n {
			break
		}
		if logits, err = q.Step(ctx, next); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func argmax(xs []float32) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg, param string) {
	e := map[string]string{"message": msg, "type": http.StatusText(status)}
	if param != "" {
		e["param"] = param
	}
	writeJSON(w, status, map[string]any{"error": e})
}

// baseline marks where the engine's memory is measured from, the library
// loaded and the model not yet: it collects the Go heap, resets the
// resident set's high-water mark and says what is resident, so that the
// mark's growth (VmHWM of /proc/PID/status, less this) is what the model,
// its buffers and its serving took at their peak.
func baseline() {
	u, err := procmem.Baseline()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ortserve: no baseline for the resident set: %v\n", err)
		return
	}
	fmt.Fprintf(os.Stderr, "ortserve: resident %d bytes before the model (the baseline)\n", u.RSS)
}
