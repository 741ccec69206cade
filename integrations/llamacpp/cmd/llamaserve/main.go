// Command llamaserve replays the first requests of an LLM conversation
// trace (the Azure LLM inference trace 2023's format: TIMESTAMP,
// ContextTokens, GeneratedTokens) with real greedy decoding on a llama
// model, once with stock llama.cpp and once with the KV cache in memgen's
// regions, under the same KV budget, and reports how many sequences each
// ran at once and how fast.
//
// Lengths are scaled so that the longest replayed trace.Request fills n_ctx.
// All requests are queued at the start (a closed loop: the question is how
// many run at once, not when they arrive). Each engine decodes its
// running requests together in one context (one sequence each; per step
// one DecodeBatch of one token of each running request, highest sequence
// first, and one of each new request's prompt, as llamacpp.Server does),
// admits the next queued trace.Request while a sequence is free and its budget
// allows, and gives a request's sequence back once its tokens are out:
//
//   - stock llama.cpp's layout preallocates n_ctx cells per sequence, so
//     its context has budget / (n_ctx x row bytes) sequences;
//   - memgen's context has -sequences sequences whose KV streams grow a
//     granule at a time; it admits while the governor's free bytes, less
//     the new prompt's rows, stay above 1/8 of the budget, and when a
//     step's growth is refused the youngest trace.Request gives its sequence up
//     and is recomputed later.
//
// KV utilisation is, at every step, the bytes of the cells in use over
// the bytes the engine holds for KV (preallocated, or committed). The
// last line sums it up: llama-replay: capacity-vs-stock (peak concurrent
// sequences), tput-vs-stock (generated tokens per second), and for how
// many requests the two engines' greedy tokens are identical (a request
// preempted and recomputed has its cells computed again as a prompt,
// which rounds differently: each trace.Request that differs is reported
// with where).
//
//	llamaserve -lib LIBLLAMA -model GGUF -trace CSV [-requests 64] [-nctx 2048] [-budget 96MiB]
//
// With -listen it serves the model instead (llamacpp.Server): an
// OpenAI-style HTTP endpoint (POST /v1/completions, POST
// /v1/chat/completions, GET /v1/models, GET /health, and the governor's
// ledger as Prometheus metrics on GET /metrics) decoding up to -sequences
// requests together in one context, each of at most -nctx tokens, within
// the KV budget -budget:
//
//	llamaserve -lib LIBLLAMA -model GGUF -listen 127.0.0.1:8080 [-sequences 16] [-nctx 2048] [-budget 96MiB] [-queue 2s]
//
// With -ledger PATH (a shared ledger, memctl create) the engine joins it
// instead of holding a budget of its own: it is planned first (llamaplan's
// plan) and refused, exit status 3 and nothing joined, when it never fits;
// otherwise its weights, KV cache and compute buffers are charged in the
// shared ledger under its holders, beside the other processes', and its
// load waits up to -join-timeout for them to give memory back.
//
// -sleep-after D puts the engine to sleep once idle for D; -sleep-on-want
// when the governor asks its weights for memory (on a ledger, another
// process's want) while no request runs. Either sleeps at -sleep-level (1:
// the weights and KV cache move to host memory outside the budget; 2: the
// weights are discarded and reloaded from the model file), and the next
// request wakes it. On a -ledger each sleep and wake (and each offload and
// restore of a KV cache) is noted in the engine's slot with the host
// tier's bytes after it: memctl show prints them, memctl watch prints each
// as it comes.
package main

import (
	"context"

	"errors"
	"flag"
	"fmt"

	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp"
	"github.com/memgen/memgen/integrations/llamacpp/internal/trace"
	"github.com/memgen/memgen/mechanisms/cpu"
)

type result struct {
	engine              string
	sequences           int // the context's sequences (n_seq_max)
	peak                int
	meanRunning         float64 // over every step
	meanSaturated       float64 // over the steps while requests were queued
	tokens, preemptions int
	generated           int // tokens generated (each request's, once)
	utilisation         float64
	took                time.Duration
	out                 [][]int32 // each request's greedy tokens
}

// seq is a running request: its sequence in the context, what it has
// generated, and the token to decode next.
type seq struct {
	slot int
	id   int
	req  trace.Request
	next int32
	out  []int32
}

// engine is what a replay runs on: one context of several sequences, an
// admission rule (whether one more trace.Request may start now) and the KV bytes
// it holds.
type engine struct {
	c     *llamacpp.Context
	admit func(running []*seq, r trace.Request) bool
	held  func() memapi.Bytes
	// room says whether a step decoding tokens tokens of seqs sequences
	// (prompts new of them) can grow within the budget; when it cannot,
	// the youngest running trace.Request gives its sequence up and goes back to
	// the queue's front (it is recomputed from its prompt later). nil:
	// always (stock's preallocated layout).
	room func(tokens, seqs, prompts int) bool
}

// promptOf is trace.Request id's prompt (the same on both engines).
func promptOf(id, n, vocab int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((id*7919 + i*104729 + 13) % vocab)
	}
	return p
}

// replay runs the requests on e: at every step the requests admitted so
// far decode (a new one its whole prompt, in a DecodeBatch of its own; the
// others one token each, together in one, highest sequence first), and a
// finished one gives its sequence back.
func replay(ctx context.Context, m *llamacpp.Model, e engine, rs []trace.Request, rowBytes memapi.Bytes) (result, error) {
	res := result{sequences: e.c.Sequences(), out: make([][]int32, len(rs))}
	free := make([]int, 0, e.c.Sequences())
	for i := e.c.Sequences() - 1; i >= 0; i-- {
		free = append(free, i)
	}
	type queued struct {
		id  int
		req trace.Request
	}
	var queue []queued
	for id, r := range rs {
		queue = append(queue, queued{id, r})
	}
	var running []*seq
	var sumRunning, steps, sumSat, stepsSat int
	var used, heldSum float64
	// held: after a preemption no trace.Request is admitted until one finishes
	// (else the preempted one would come straight back and be refused
	// again).
	held := false
	start := time.Now()
	for len(queue) > 0 || len(running) > 0 {
		var in []llamacpp.SeqTokens
		for !held && len(queue) > 0 && len(free) > 0 && e.admit(running, queue[0].req) {
			q := queue[0]
			queue = queue[1:]
			s := &seq{slot: free[len(free)-1], id: q.id, req: q.req}
			free = free[:len(free)-1]
			running = append(running, s)
		}
		if len(running) == 0 {
			return res, fmt.Errorf("a trace.Request of %d tokens cannot be admitted under the budget", queue[0].req.Prompt+queue[0].req.Gen)
		}
		// A trace.Request not decoded yet decodes its prompt, the others their
		// last token.
		for _, s := range running {
			toks := []int32{s.next}
			if len(s.out) == 0 {
				toks = promptOf(s.id, s.req.Prompt, m.NVocab())
			}
			in = append(in, llamacpp.SeqTokens{Seq: s.slot, Tokens: toks})
		}
		tokens, prompts := 0, 0
		for _, t := range in {
			tokens += len(t.Tokens)
			if len(t.Tokens) > 1 {
				prompts++
			}
		}
		if e.room != nil && len(running) > 1 && !e.room(tokens, len(in), prompts) {
			// The youngest trace.Request gives its sequence up and waits again.
			y := running[len(running)-1]
			running = running[:len(running)-1]
			if err := e.c.ResetSeq(ctx, y.slot); err != nil {
				return res, err
			}
			free = append(free, y.slot)
			queue = append([]queued{{y.id, y.req}}, queue...)
			res.preemptions++
			held = true
			continue
		}
		// As llamacpp.Server does: the decode tokens in one call, highest
		// sequence first, each prompt in a call of its own, so that a
		// request's arithmetic does not depend on its neighbours.
		var calls [][]llamacpp.SeqTokens
		var decodes []llamacpp.SeqTokens
		for _, t := range in {
			if len(t.Tokens) > 1 {
				calls = append(calls, []llamacpp.SeqTokens{t})
			} else {
				decodes = append(decodes, t)
			}
		}
		if len(decodes) > 0 {
			slices.SortFunc(decodes, func(a, b llamacpp.SeqTokens) int { return b.Seq - a.Seq })
			calls = append([][]llamacpp.SeqTokens{decodes}, calls...)
		}
		bySlot := map[int]int32{}
		for _, call := range calls {
			stepCtx, cancel := context.WithTimeout(ctx, time.Minute)
			next, err := e.c.DecodeBatch(stepCtx, call)
			cancel()
			if err != nil {
				return res, err
			}
			for i, t := range next {
				bySlot[call[i].Seq] = t
			}
		}
		res.peak = max(res.peak, len(running))
		sumRunning += len(running)
		steps++
		if len(queue) > 0 {
			sumSat += len(running)
			stepsSat++
		}
		keep := running[:0]
		for _, s := range running {
			s.next = bySlot[s.slot]
			s.out = append(s.out, s.next)
			if len(s.out) == s.req.Gen {
				res.out[s.id] = s.out
				res.generated += len(s.out)
				if err := e.c.ResetSeq(ctx, s.slot); err != nil {
					return res, err
				}
				free = append(free, s.slot)
				held = false
				continue
			}
			keep = append(keep, s)
		}
		running = keep
		var cells int
		for _, s := range running {
			cells += s.req.Prompt + len(s.out)
		}
		used += float64(memapi.Bytes(cells) * rowBytes)
		heldSum += float64(e.held())
	}
	res.took = time.Since(start)
	res.tokens = e.c.Stats().Tokens
	res.meanRunning = float64(sumRunning) / float64(steps)
	if stepsSat > 0 {
		res.meanSaturated = float64(sumSat) / float64(stepsSat)
	}
	if heldSum > 0 {
		res.utilisation = used / heldSum
	}
	return res, nil
}

func parseBytes(s string) (memapi.Bytes, error) {
	mult := memapi.Bytes(1)
	for _, u := range []struct {
		suffix string
		m      memapi.Bytes
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.m
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return memapi.Bytes(n) * mult, err
}

func main() {
	lib := flag.String("lib", os.Getenv("MEMGEN_LLAMACPP_LIB"), "libllama (scripts/llamacpp.sh prints it)")
	model := flag.String("model", os.Getenv("MEMGEN_LLAMACPP_MODEL"), "a llama GGUF model")
	trace := flag.String("trace", "../../cmd/memdemo/trace/azure-llm-conv-2023-excerpt.csv", "the trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens)")
	n := flag.Int("requests", 64, "requests replayed (the trace's first)")
	nCtx := flag.Int("nctx", 2048, "each context's n_ctx; lengths are scaled so that the longest trace.Request fills it")
	budgetS := flag.String("budget", "96MiB", "KV budget, the same for both engines")
	threads := flag.Int("threads", 1, "llama.cpp threads")
	timeout := flag.Duration("timeout", 30*time.Minute, "the whole run's deadline (both engines' replays); its expiry is reported as a deadline")
	listen := flag.String("listen", "", "serve the HTTP endpoint on this address (host:port) instead of replaying the trace")
	seqs := flag.Int("sequences", 64, "requests memgen decodes together (with -listen: 16 unless set)")
	queue := flag.Duration("queue", 2*time.Second, "with -listen: how long a trace.Request waits for a sequence and budget before a 429")
	ledger := flag.String("ledger", "", "with -listen: join this shared ledger (memctl create) instead of a budget of its own; -budget then\ndefaults to the plan's KV cache at full context")
	join := flag.Duration("join-timeout", 30*time.Second, "with -ledger: how long loading the model and creating its context wait for other processes to give memory back")
	sleepAfter := flag.Duration("sleep-after", 0, "with -listen: idle this long, the engine sleeps (its weights and KV cache move to host memory outside the\nbudget, the device's backing given back, every address kept) and the next request wakes it (0: never)")
	sleepLevel := flag.Int("sleep-level", 1, "with -sleep-after or -sleep-on-want: 1 moves the weights (and KV cache) to host memory; 2 discards the weights, and the next\nrequest reloads them from the model file")
	sleepOnWant := flag.Bool("sleep-on-want", false, "with -listen: when the governor asks the weights for memory (on a -ledger, another process's want; else a shortfall\nof the budget) and no request runs, the engine sleeps at -sleep-level and gives the device bytes back; the next request wakes it")
	stock := flag.Bool("stock", false, "with -listen: serve stock llama.cpp (its own buffers, every sequence's n_ctx of KV allocated at start, as llama-server does;\nno ledger, -budget ignored), for comparison")
	flag.Parse()
	if *listen != "" {
		seen := false
		flag.Visit(func(f *flag.Flag) { seen = seen || f.Name == "sequences" })
		if !seen {
			*seqs = 16
		}
		var budget memapi.Bytes
		var err error
		budgetSet := false
		flag.Visit(func(f *flag.Flag) { budgetSet = budgetSet || f.Name == "budget" })
		if *ledger == "" || budgetSet {
			budget, err = parseBytes(*budgetS)
		}
		if err == nil {
			err = serve(serveConfig{lib: *lib, model: *model, listen: *listen, budget: budget, seqs: *seqs, nCtx: *nCtx,
				threads: *threads, queue: *queue, ledger: *ledger, join: *join, stock: *stock, sleepAfter: *sleepAfter, sleepLevel: *sleepLevel, sleepOnWant: *sleepOnWant})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "llamaserve:", err)
			var fe *xproc.FitError
			if errors.As(err, &fe) {
				os.Exit(3) // refused: it never fits the ledger, nothing joined
			}
			os.Exit(1)
		}
		return
	}
	if err := run(*lib, *model, *trace, *n, *nCtx, *seqs, *budgetS, *threads, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "llamaserve:", err)
		os.Exit(1)
	}
}

func run(lib, model, tracePath string, n, nCtx, seqs int, budgetS string, threads int, timeout time.Duration) (err error) {
	budget, err := parseBytes(budgetS)
	if err != nil {
		return fmt.Errorf("-budget %q: %w", budgetS, err)
	}
	rs, err := trace.Read(tracePath, n)
	if err != nil {
		return err
	}
	rs = trace.Scale(rs, nCtx)
	if err := llamacpp.Init(lib); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	defer func() {
		// A refusal at the run's deadline says so, not "over budget".
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("deadline: the run's -timeout of %v expired before it finished: %w", timeout, err)
		}
	}()

	// Stock: the row bytes come from memgen's run of one context (the same
	// model); stock holds n_ctx rows per context.
	stock, err := llamacpp.LoadModel(ctx, model, llamacpp.Options{Stock: true, Threads: threads})
	if err != nil {
		return err
	}
	defer stock.Close(ctx)

	// memgen: a governor whose authority is the weights plus the budget.
	h, err := newHost("")
	if err != nil {
		return err
	}
	defer h.close()
	g := h.g
	ours, err := llamacpp.LoadModel(ctx, model, llamacpp.Options{Manager: h.mgr, Governor: g, Device: h.key, Threads: threads})
	if err != nil {
		return err
	}
	defer ours.Close(ctx)
	weights, _ := memapi.RoundUp(ours.WeightBytes(), cpu.Granularity4KiB)
	if err := g.SetCapacity("host", weights+budget); err != nil {
		return err
	}
	probe, err := ours.NewContext(ctx, llamacpp.ContextOptions{NCtx: nCtx})
	if err != nil {
		return err
	}
	rowBytes := probe.KV().RowBytes
	if err := probe.Close(ctx); err != nil {
		return err
	}
	perStock := memapi.Bytes(nCtx) * rowBytes
	stockSeqs := int(budget / perStock)
	if stockSeqs < 1 {
		return fmt.Errorf("-budget %d holds no sequence of n_ctx %d preallocated (%d bytes)", budget, nCtx, perStock)
	}
	if stockSeqs > 256 || seqs > 256 || nCtx%256 != 0 {
		return fmt.Errorf("at most 256 sequences (stock's budget holds %d, -sequences %d), and -nctx a multiple of 256", stockSeqs, seqs)
	}

	// Stock: its preallocated layout, batched: one context of as many
	// sequences as the budget holds at n_ctx each (non-unified: each
	// stream's n_ctx cells allocated at creation).
	sc, err := stock.NewContext(ctx, llamacpp.ContextOptions{NCtx: nCtx, Sequences: stockSeqs, Batch: 512})
	if err != nil {
		return err
	}
	a, err := replay(ctx, stock, engine{c: sc,
		admit: func(running []*seq, r trace.Request) bool { return true }, // a free sequence is all it needs
		held:  func() memapi.Bytes { return memapi.Bytes(stockSeqs) * perStock }}, rs, rowBytes)
	sc.Close(ctx)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	a.engine = "stock llama.cpp (n_ctx preallocated per sequence)"

	// memgen: one context of -sequences sequences whose streams grow;
	// a trace.Request is admitted while the governor's free bytes, less its
	// prompt's rows (and a tile), stay above an eighth of the budget; a
	// step whose growth would not fit preempts the youngest request.
	oc, err := ours.NewContext(ctx, llamacpp.ContextOptions{NCtx: nCtx, Sequences: seqs, Batch: 512})
	if err != nil {
		return err
	}
	granules := memapi.Bytes(oc.KV().Tensors) * oc.Granularity()
	b, err := replay(ctx, ours, engine{c: oc,
		room: func(tokens, seqs, prompts int) bool {
			// The step's rows, a tile per prompt, a granule per tensor of
			// each sequence's rounding.
			s, _ := g.Authority("host")
			return s.Free >= memapi.Bytes(tokens+64*prompts)*rowBytes+memapi.Bytes(seqs)*granules
		},
		admit: func(running []*seq, r trace.Request) bool {
			s, _ := g.Authority("host")
			need, _ := memapi.RoundUp(memapi.Bytes(r.Prompt+64)*rowBytes, 64*rowBytes)
			return s.Free >= need+budget/8
		},
		held: func() memapi.Bytes { return oc.KV().Committed }}, rs, rowBytes)
	closeErr := oc.Close(ctx)
	if err != nil {
		return fmt.Errorf("memgen: %w", err)
	}
	if closeErr != nil {
		return closeErr
	}
	b.engine = "memgen (streams grown per token)"

	var prompt, gen int
	for _, r := range rs {
		prompt += r.Prompt
		gen += r.Gen
	}
	fmt.Printf("%d requests of %s, scaled to n_ctx %d (%d prompt + %d generated tokens); KV budget %d MiB; %d KiB of KV per token; stock holds %d MiB per sequence\n",
		len(rs), tracePath, nCtx, prompt, gen, budget>>20, rowBytes>>10, perStock>>20)
	fmt.Println("engine | sequences | peak concurrent | mean concurrent while requests queue | mean concurrent | tokens decoded | preemptions | KV utilisation | generated tokens/s | wall time")
	fmt.Println("--- | --- | --- | --- | --- | --- | --- | --- | --- | ---")
	for _, r := range []result{a, b} {
		fmt.Printf("%s | %d | %d | %.1f | %.1f | %d | %d | %.1f %% | %.0f | %.1f s\n", r.engine, r.sequences, r.peak, r.meanSaturated, r.meanRunning, r.tokens, r.preemptions,
			100*r.utilisation, float64(r.generated)/r.took.Seconds(), r.took.Seconds())
	}
	same := 0
	for i := range a.out {
		if slices.Equal(a.out[i], b.out[i]) {
			same++
			continue
		}
		at := 0
		for at < min(len(a.out[i]), len(b.out[i])) && a.out[i][at] == b.out[i][at] {
			at++
		}
		fmt.Printf("trace.Request %d (%d prompt, %d generated tokens): the engines' greedy tokens first differ at token %d (its batches differ between the engines: llama.cpp's sums can round differently)\n",
			i, rs[i].Prompt, rs[i].Gen, at)
	}
	capacity := float64(b.peak) / float64(a.peak)
	tput := (float64(b.generated) / b.took.Seconds()) / (float64(a.generated) / a.took.Seconds())
	fmt.Printf("memgen / stock: peak concurrent sequences %.1fx, while requests queue %.1fx, overall %.1fx; generated tokens/s %.2fx; greedy tokens identical for %d of %d requests\n",
		capacity, b.meanSaturated/a.meanSaturated, b.meanRunning/a.meanRunning, tput, same, len(a.out))
	fmt.Printf("llama-replay: requests=%d capacity-vs-stock=%.1fx tput-vs-stock=%.2fx tokens-identical=%d/%d\n", len(a.out), capacity, tput, same, len(a.out))
	return nil
}
