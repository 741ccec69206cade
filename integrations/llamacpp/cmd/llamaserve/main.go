// Command llamaserve replays the first requests of an LLM conversation
// trace (the Azure LLM inference trace 2023's format: TIMESTAMP,
// ContextTokens, GeneratedTokens) with real greedy decoding on a llama
// model, once with stock llama.cpp and once with the KV cache in memgen's
// regions, under the same KV budget, and reports how many sequences each
// ran at once.
//
// Lengths are scaled so that the longest replayed request fills n_ctx.
// All requests are queued at the start (a closed loop: the question is how
// many run at once, not when they arrive). Each engine admits the next
// queued request while its budget allows, decodes the running sequences
// one step each in turn, and closes a sequence once its generated tokens
// are out:
//
//   - stock llama.cpp's contexts each allocate n_ctx cells up front, so it
//     admits while budget / (n_ctx x row bytes) contexts are not all open;
//   - memgen admits while the governor's free bytes, less the new prompt's
//     rows, stay above 1/8 of the budget; sequences grow a granule at a
//     time, and when one cannot, the governor preempts an idle one whole
//     (it recomputes later).
//
// KV utilisation is, at every step, the bytes of the cells in use over
// the bytes the engine holds for KV (preallocated, or committed).
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
package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/memgen/memgen/ep"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/integrations/llamacpp"
	"github.com/memgen/memgen/mechanisms/cpu"
	"github.com/memgen/memgen/pmm"
)

type request struct{ prompt, gen int }

// readTrace reads the first n requests of a trace CSV.
func readTrace(path string, n int) ([]request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	ic, ok1 := col["ContextTokens"]
	ig, ok2 := col["GeneratedTokens"]
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%s: no ContextTokens and GeneratedTokens columns", path)
	}
	var out []request
	for len(out) < n {
		rec, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		p, err1 := strconv.Atoi(rec[ic])
		g, err2 := strconv.Atoi(rec[ig])
		if err1 != nil || err2 != nil || p < 0 || g < 0 || p+g == 0 {
			return nil, fmt.Errorf("%s: line %d: bad token counts %q, %q", path, len(out)+2, rec[ic], rec[ig])
		}
		out = append(out, request{p, g})
	}
	return out, nil
}

// scale makes the longest request fill nCtx; every request keeps at least
// one prompt token and one generated token.
func scale(rs []request, nCtx int) []request {
	longest := 0
	for _, r := range rs {
		longest = max(longest, r.prompt+r.gen)
	}
	out := make([]request, len(rs))
	for i, r := range rs {
		p := max(1, r.prompt*nCtx/longest)
		g := max(1, r.gen*nCtx/longest)
		if p+g > nCtx {
			g = nCtx - p
		}
		out[i] = request{p, g}
	}
	return out
}

type result struct {
	engine              string
	peak                int
	meanRunning         float64 // over every step
	meanSaturated       float64 // over the steps while requests were queued
	tokens, preemptions int
	utilisation         float64
	took                time.Duration
	hashes              []uint64 // each request's greedy tokens (FNV-1a)
}

type seq struct {
	c         *llamacpp.Context
	id        int
	req       request
	next      int32
	generated int
	hash      uint64
}

// replay runs the requests on m; admit says whether one more of them may
// start now, held reports the KV bytes held now.
func replay(ctx context.Context, m *llamacpp.Model, rs []request, nCtx int, admit func(running []*seq, r request) bool, held func(running []*seq) memapi.Bytes, rowBytes memapi.Bytes) (result, error) {
	var res result
	var running []*seq
	queue := rs
	var sumRunning, steps, sumSat, stepsSat int
	var used, heldSum float64
	start := time.Now()
	res.hashes = make([]uint64, len(rs))
	for id := 0; len(queue) > 0 || len(running) > 0; {
		for len(queue) > 0 && admit(running, queue[0]) {
			r := queue[0]
			queue = queue[1:]
			c, err := m.NewContext(ctx, llamacpp.ContextOptions{NCtx: nCtx, Batch: 128})
			if err != nil {
				return res, err
			}
			p := make([]int32, r.prompt)
			for i := range p {
				p[i] = int32((id*7919 + i*104729 + 13) % m.NVocab())
			}
			next, err := c.Decode(ctx, p)
			if err != nil {
				return res, errors.Join(err, c.Close(ctx))
			}
			running = append(running, &seq{c: c, id: id, req: r, next: next, hash: 14695981039346656037})
			id++
		}
		if len(running) == 0 {
			return res, fmt.Errorf("a request of %d tokens cannot be admitted under the budget", queue[0].prompt+queue[0].gen)
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
			if s.generated == s.req.gen {
				res.hashes[s.id] = (s.hash ^ uint64(s.next)) * 1099511628211
				st := s.c.Stats()
				res.tokens += st.Tokens
				res.preemptions += st.Preemptions
				if err := s.c.Close(ctx); err != nil {
					return res, err
				}
				continue
			}
			next, err := s.c.Decode(ctx, []int32{s.next})
			if err != nil {
				return res, err
			}
			s.hash = (s.hash ^ uint64(s.next)) * 1099511628211
			s.next = next
			s.generated++
			keep = append(keep, s)
		}
		running = keep
		var cells int
		for _, s := range running {
			cells += s.req.prompt + s.generated
		}
		used += float64(memapi.Bytes(cells) * rowBytes)
		heldSum += float64(held(running))
	}
	res.took = time.Since(start)
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
	nCtx := flag.Int("nctx", 2048, "each context's n_ctx; lengths are scaled so that the longest request fills it")
	budgetS := flag.String("budget", "96MiB", "KV budget, the same for both engines")
	threads := flag.Int("threads", 1, "llama.cpp threads")
	timeout := flag.Duration("timeout", 30*time.Minute, "the whole run's deadline (both engines' replays); its expiry is reported as a deadline")
	listen := flag.String("listen", "", "serve the HTTP endpoint on this address (host:port) instead of replaying the trace")
	seqs := flag.Int("sequences", 16, "with -listen: requests decoded together")
	queue := flag.Duration("queue", 2*time.Second, "with -listen: how long a request waits for a sequence and budget before a 429")
	flag.Parse()
	if *listen != "" {
		budget, err := parseBytes(*budgetS)
		if err == nil {
			err = serve(*lib, *model, *listen, budget, *seqs, *nCtx, *threads, *queue)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "llamaserve:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*lib, *model, *trace, *n, *nCtx, *budgetS, *threads, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "llamaserve:", err)
		os.Exit(1)
	}
}

func run(lib, model, trace string, n, nCtx int, budgetS string, threads int, timeout time.Duration) (err error) {
	budget, err := parseBytes(budgetS)
	if err != nil {
		return fmt.Errorf("-budget %q: %w", budgetS, err)
	}
	rs, err := readTrace(trace, n)
	if err != nil {
		return err
	}
	rs = scale(rs, nCtx)
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
	g := governor.New(governor.Options{})
	defer g.Close()
	mech, err := cpu.New(cpu.Options{Granularity: cpu.Granularity4KiB, Authority: "host"})
	if err != nil {
		return err
	}
	ectx := ep.NewContext(cpu.NewContext(mech), ep.Options{})
	mgr := pmm.New(g, pmm.Options{})
	host := memapi.DeviceKey{Kind: memapi.DeviceKindHost}
	if err := g.AddAuthority("host", 1<<40); err != nil {
		return err
	}
	if err := mgr.Register(pmm.Device{Key: host, Mechanism: mech, Context: ectx, Authority: "host"}); err != nil {
		return err
	}
	defer func() { _ = mgr.Close(ctx); _ = ectx.Close(ctx, true) }()
	ours, err := llamacpp.LoadModel(ctx, model, llamacpp.Options{Manager: mgr, Governor: g, Device: host, Threads: threads})
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

	a, err := replay(ctx, stock, rs, nCtx,
		func(running []*seq, r request) bool { return memapi.Bytes(len(running)+1)*perStock <= budget },
		func(running []*seq) memapi.Bytes { return memapi.Bytes(len(running)) * perStock }, rowBytes)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	a.engine = "stock llama.cpp (n_ctx preallocated)"
	b, err := replay(ctx, ours, rs, nCtx,
		func(running []*seq, r request) bool {
			s, _ := g.Authority("host")
			need, _ := memapi.RoundUp(memapi.Bytes(r.prompt)*rowBytes, 64*rowBytes)
			return s.Free >= need+budget/8
		},
		func(running []*seq) memapi.Bytes {
			var h memapi.Bytes
			for _, s := range running {
				h += s.c.KV().Committed
			}
			return h
		}, rowBytes)
	if err != nil {
		return fmt.Errorf("memgen: %w", err)
	}
	b.engine = "memgen (regions grown per token)"

	var prompt, gen int
	for _, r := range rs {
		prompt += r.prompt
		gen += r.gen
	}
	fmt.Printf("%d requests of %s, scaled to n_ctx %d (%d prompt + %d generated tokens); KV budget %d MiB; %d KiB of KV per token; stock holds %d MiB per context\n",
		len(rs), trace, nCtx, prompt, gen, budget>>20, rowBytes>>10, perStock>>20)
	fmt.Println("engine | peak concurrent | mean concurrent while requests queue | mean concurrent | tokens decoded | preemptions | KV utilisation | wall time")
	fmt.Println("--- | --- | --- | --- | --- | --- | --- | ---")
	for _, r := range []result{a, b} {
		fmt.Printf("%s | %d | %.1f | %.1f | %d | %d | %.1f %% | %.1f s\n", r.engine, r.peak, r.meanSaturated, r.meanRunning, r.tokens, r.preemptions, 100*r.utilisation, r.took.Seconds())
	}
	same := 0
	for i := range a.hashes {
		if a.hashes[i] == b.hashes[i] {
			same++
		}
	}
	fmt.Printf("memgen / stock concurrent sequences: peak %.1fx, while requests queue %.1fx, overall %.1fx; greedy tokens identical for %d of %d requests\n",
		float64(b.peak)/float64(a.peak), b.meanSaturated/a.meanSaturated, b.meanRunning/a.meanRunning, same, len(a.hashes))
	if same != len(a.hashes) {
		return errors.New("the engines' greedy tokens differ")
	}
	return nil
}
