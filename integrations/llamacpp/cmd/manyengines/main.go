// Command manyengines replays a slice of an LLM conversation trace against
// several running llamaserve engines (their HTTP endpoints) and measures
// how many sequences they ran at once, what each request's greedy tokens
// were, and, given the shared ledger they joined, whether the ledger
// agreed with the engines' own governors.
//
//	manyengines -engine tiny=http://127.0.0.1:8081 -engine gqa=http://127.0.0.1:8082 \
//	    [-trace CSV] [-requests 64] [-nctx 1024] [-ledger PATH] [-o run.json]
//	manyengines -compare [-oom-kills K] [-plan NAME=PLANNED:MEASURED ...] memgen.json static.json
//
// Request i goes to engine i mod N; lengths are scaled so that the longest
// request fills -nctx; its prompt is token ids drawn from i (the same in
// every run). All requests are sent at the start (a closed loop: the
// question is how many run at once), each engine queues what it cannot
// admit yet (start it with a long -queue), and a 429 is retried after its
// Retry-After. Every 50 ms each engine's /stats is read: the sequences
// running, summed over the engines, give the peak and the mean while
// requests wait. With -ledger, before the first request and after the
// last, once the engines are idle, the ledger is audited: the bytes it
// says are charged must be what the engines' own governors have charged,
// summed (their /metrics); a difference is drift.
//
// -o writes the run as JSON; -compare reads two runs (the engines on one
// shared ledger, then stock engines each on a static share) and prints the
// comparison side by side, with what the caller counted outside the runs:
// the engines the kernel killed in each (-oom-kills, -static-oom-kills),
// each engine's plan against its resident set's measured peak growth
// (-plan NAME=PLANNED:MEASURED), and how stock engines fared when started
// with the shared run's sequences preallocated (-stock-start
// NAME=served|killed|refused). Last comes a line (plan-error is the
// largest error of a plan, in percent of the measure):
//
//	many-engines: engines=N requests=R served=S oom-kills=K drift=D tokens-identical=T/S peak-seqs=P static-peak-seqs=Q plan-error=E%
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp/internal/trace"
	"github.com/memgen/memgen/memreport"
)

// engine is one llamaserve endpoint.
type engine struct {
	Name string `json:"name"`
	URL  string `json:"url"`
}

// Run is one replay's result.
type Run struct {
	Engines  []engine `json:"engines"`
	Requests int      `json:"requests"`
	Served   int      `json:"served"`
	Retries  int      `json:"retries"` // 429s retried
	// Peak is the most sequences the engines ran at once, summed; PeakBy
	// each engine's own peak (its /stats).
	Peak   int            `json:"peak"`
	PeakBy map[string]int `json:"peak_by"`
	// PreemptedBy is each engine's preemptions (its KV cache given up
	// under pressure, its sequences recomputed), where it had any.
	PreemptedBy map[string]int `json:"preempted_by,omitempty"`
	// MeanQueued is the mean of the summed running sequences over the
	// samples taken while some request was still waiting to be admitted.
	MeanQueued float64 `json:"mean_queued"`
	// Tokens are each request's greedy tokens; Top2 each token's logit,
	// the runner-up and its logit, where the engine answers them.
	Tokens [][]int32 `json:"tokens"`
	Top2   [][]top2  `json:"top2"`
	// Audits are the ledger audits (with -ledger): the largest difference
	// between an engine's governor and the ledger at each.
	Audits []Audit  `json:"audits"`
	Wall   float64  `json:"wall_seconds"`
	Errors []string `json:"errors"`
}

// Audit is one comparison of the engines' governors with the ledger.
type Audit struct {
	When    string `json:"when"`
	Charged uint64 `json:"ledger_charged"`  // the ledger's total
	Engines uint64 `json:"engines_charged"` // the engines' governors', summed
	Drift   uint64 `json:"drift"`           // |the two|
}

type engineFlags []engine

func (e *engineFlags) String() string { return fmt.Sprint(*e) }
func (e *engineFlags) Set(v string) error {
	name, url, ok := strings.Cut(v, "=")
	if !ok || name == "" || url == "" {
		return fmt.Errorf("want NAME=URL, got %q", v)
	}
	*e = append(*e, engine{name, strings.TrimSuffix(url, "/")})
	return nil
}

func main() {
	var engines engineFlags
	flag.Var(&engines, "engine", "an engine as NAME=URL (repeat for each)")
	tracePath := flag.String("trace", "../../cmd/memdemo/trace/azure-llm-conv-2023-excerpt.csv", "the trace (CSV: TIMESTAMP,ContextTokens,GeneratedTokens)")
	n := flag.Int("requests", 64, "requests replayed (the trace's first)")
	nCtx := flag.Int("nctx", 1024, "the engines' n_ctx: lengths are scaled so that the longest request fills it")
	ledger := flag.String("ledger", "", "the shared ledger the engines joined: audit it before and after")
	out := flag.String("o", "", "write the run as JSON to this file")
	report := flag.String("report", "", "with -ledger: write a memory report (HTML) of the shared ledger over time, by engine and holder")
	compare := flag.Bool("compare", false, "compare two runs' JSON files (shared ledger, then static shares) instead")
	var cmp comparison
	flag.IntVar(&cmp.oomShared, "oom-kills", 0, "with -compare: the shared run's engines the kernel killed, as the caller counted them")
	flag.IntVar(&cmp.oomStatic, "static-oom-kills", 0, "with -compare: the static run's engines the kernel killed")
	flag.Var(&cmp.plans, "plan", "with -compare: an engine's plan against what it really took, as NAME=PLANNED:MEASURED (bytes; repeat)")
	flag.Var(&cmp.starts, "stock-start", "with -compare: a stock engine started as the shared run sizes it, as NAME=OUTCOME (served, killed, refused; repeat)")
	timeout := flag.Duration("timeout", 20*time.Minute, "the whole replay's deadline")
	flag.Parse()
	if *compare {
		if flag.NArg() != 2 {
			fmt.Fprintln(os.Stderr, "manyengines -compare SHARED.json STATIC.json")
			os.Exit(2)
		}
		if err := cmp.print(os.Stdout, flag.Arg(0), flag.Arg(1)); err != nil {
			fmt.Fprintln(os.Stderr, "manyengines:", err)
			os.Exit(1)
		}
		return
	}
	if len(engines) == 0 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "manyengines: at least one -engine NAME=URL, and no arguments")
		os.Exit(2)
	}
	rs, err := trace.Read(*tracePath, *n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manyengines:", err)
		os.Exit(1)
	}
	// A request's prompt and completion fit n_ctx with a token to spare.
	rs = trace.Scale(rs, *nCtx-1)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var rec *memreport.Recorder
	if *report != "" {
		if *ledger == "" {
			fmt.Fprintln(os.Stderr, "manyengines: -report needs -ledger")
			os.Exit(2)
		}
		rec = memreport.New(memreport.Options{Title: "many engines, one shared ledger"})
	}
	run, err := replay(ctx, engines, rs, *ledger, rec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manyengines:", err)
		os.Exit(1)
	}
	fmt.Printf("manyengines: %d engines, %d requests, %d served, %d retried after a 429, peak %d sequences at once (%s), mean %.1f while requests waited, %.1f s\n",
		len(engines), run.Requests, run.Served, run.Retries, run.Peak, peaks(run), run.MeanQueued, run.Wall)
	for _, a := range run.Audits {
		fmt.Printf("audit %s: ledger %d, engines %d, drift %d\n", a.When, a.Charged, a.Engines, a.Drift)
	}
	if rec != nil {
		if err := writeReport(rec, run, *report); err != nil {
			fmt.Fprintln(os.Stderr, "manyengines:", err)
			os.Exit(1)
		}
		fmt.Printf("memory report: %s\n", *report)
	}
	if *out != "" {
		b, _ := json.MarshalIndent(run, "", " ")
		if err := os.WriteFile(*out, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "manyengines:", err)
			os.Exit(1)
		}
	}
	if run.Served != run.Requests || len(run.Errors) > 0 {
		for _, e := range run.Errors {
			fmt.Fprintln(os.Stderr, "manyengines:", e)
		}
		os.Exit(1)
	}
}

// promptIDs is request i's prompt: n token ids from 10 to 999 (ids every
// engine's vocabulary has, past the special tokens), drawn from i.
func promptIDs(i, n int) []int32 {
	r := rand.New(rand.NewPCG(uint64(i), 0x6d616e79))
	out := make([]int32, n)
	for k := range out {
		out[k] = int32(10 + r.IntN(990))
	}
	return out
}

func replay(ctx context.Context, engines []engine, rs []trace.Request, ledger string, rec *memreport.Recorder) (*Run, error) {
	run := &Run{Engines: engines, Requests: len(rs), Tokens: make([][]int32, len(rs)), Top2: make([][]top2, len(rs)), PeakBy: map[string]int{}}
	client := &http.Client{}
	if ledger != "" {
		a, err := audit(ctx, client, engines, ledger, "before")
		if err != nil {
			return nil, err
		}
		run.Audits = append(run.Audits, a)
	}
	start := time.Now()
	var (
		mu       sync.Mutex
		inflight = len(rs)
	)
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := engines[i%len(engines)]
			toks, tops, retries, err := complete(ctx, client, e, promptIDs(i, r.Prompt), r.Gen)
			mu.Lock()
			defer mu.Unlock()
			inflight--
			run.Retries += retries
			if err != nil {
				run.Errors = append(run.Errors, fmt.Sprintf("request %d on %s: %v", i, e.Name, err))
				return
			}
			run.Tokens[i], run.Top2[i] = toks, tops
			run.Served++
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var sum float64
	var samples int
sampling:
	for {
		select {
		case <-done:
			break sampling
		case <-tick.C:
		}
		running := 0
		for _, e := range engines {
			st, err := stats(ctx, client, e)
			if err != nil {
				continue
			}
			running += st.Running
		}
		run.Peak = max(run.Peak, running)
		if rec != nil {
			if snap, err := ledgerSnapshot(ctx, client, engines, ledger, rec); err == nil {
				rec.Sample(snap)
			}
		}
		mu.Lock()
		waiting := inflight > running
		mu.Unlock()
		if waiting {
			sum += float64(running)
			samples++
		}
	}
	run.Wall = time.Since(start).Seconds()
	if samples > 0 {
		run.MeanQueued = sum / float64(samples)
	}
	for _, e := range engines {
		if st, err := stats(ctx, client, e); err == nil {
			run.PeakBy[e.Name] = st.Peak
			if st.Preemptions > 0 {
				if run.PreemptedBy == nil {
					run.PreemptedBy = map[string]int{}
				}
				run.PreemptedBy[e.Name] = st.Preemptions
			}
		}
	}
	if ledger != "" {
		a, err := audit(ctx, client, engines, ledger, "after")
		if err != nil {
			return nil, err
		}
		run.Audits = append(run.Audits, a)
		if rec != nil {
			if snap, err := ledgerSnapshot(ctx, client, engines, ledger, rec); err == nil {
				rec.Sample(snap)
				rec.End(snap)
			}
		}
	}
	return run, nil
}

// ledgerAuthority names the shared ledger in the report.
const ledgerAuthority = "shared ledger"

// ledgerSnapshot is the shared ledger as one authority of a governor
// snapshot, for the memory report: its capacity from the ledger file, its
// holders every engine's (ENGINE/HOLDER, their charges from the engine's
// /metrics), charged their sum; the chart then shows the ledger over time
// by engine and holder (each labelled in rec with its role).
func ledgerSnapshot(ctx context.Context, c *http.Client, engines []engine, ledger string, rec *memreport.Recorder) (governor.Snapshot, error) {
	h, _, err := xproc.Inspect(ledger)
	if err != nil {
		return governor.Snapshot{}, err
	}
	snap := governor.Snapshot{Time: time.Now()}
	var total memapi.Bytes
	for _, e := range engines {
		_, hs, err := governorCharges(ctx, c, e)
		if err != nil {
			return governor.Snapshot{}, err
		}
		for _, name := range slices.Sorted(maps.Keys(hs)) {
			if rec != nil {
				role := "kv-cache and compute"
				if strings.HasSuffix(name, "/weights") {
					role = "weights"
				}
				rec.Label(governor.HolderID(e.Name+"/"+name), role)
			}
			snap.Holders = append(snap.Holders, governor.HolderSnapshot{ID: governor.HolderID(e.Name + "/" + name),
				Authorities: []governor.HolderAuthoritySnapshot{{Authority: ledgerAuthority, Charged: hs[name]}}})
			total += hs[name]
		}
	}
	capacity := memapi.Bytes(h.Capacity)
	snap.Authorities = []governor.AuthoritySnapshot{{ID: ledgerAuthority, Capacity: capacity, Charged: total, Free: capacity - min(total, capacity)}}
	return snap, nil
}

// governorCharges reads an engine's /metrics: its governor's charged
// bytes over every authority (memgen_governor_charged_bytes) and each
// holder's (memgen_governor_holder_charged_bytes, summed over its
// authorities).
func governorCharges(ctx context.Context, c *http.Client, e engine) (memapi.Bytes, map[string]memapi.Bytes, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/metrics", nil)
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var total memapi.Bytes
	found := false
	holders := map[string]memapi.Bytes{}
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		l := s.Text()
		holder := strings.HasPrefix(l, "memgen_governor_holder_charged_bytes{")
		if !holder && !strings.HasPrefix(l, "memgen_governor_charged_bytes{") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, nil, fmt.Errorf("%s/metrics: bad line %q", e.URL, l)
		}
		if !holder {
			total += memapi.Bytes(v)
			found = true
			continue
		}
		_, rest, _ := strings.Cut(l, `holder="`)
		name, _, ok := strings.Cut(rest, `"`)
		if !ok {
			return 0, nil, fmt.Errorf("%s/metrics: bad line %q", e.URL, l)
		}
		holders[name] += memapi.Bytes(v)
	}
	if !found {
		return 0, nil, fmt.Errorf("%s/metrics has no memgen_governor_charged_bytes", e.URL)
	}
	return total, holders, s.Err()
}

// writeReport writes the memory report of the shared run: the ledger over
// time by engine and holder, its checks and figures.
func writeReport(rec *memreport.Recorder, run *Run, path string) error {
	var drift uint64
	for _, a := range run.Audits {
		drift = max(drift, a.Drift)
	}
	rec.Check("every request served", run.Served == run.Requests, fmt.Sprintf("%d of %d", run.Served, run.Requests))
	rec.Check("ledger equals the engines", drift == 0, fmt.Sprintf("largest difference %d bytes over %d audits (idle engines, before and after the replay)", drift, len(run.Audits)))
	rec.Note("engines", fmt.Sprint(len(run.Engines)))
	rec.Note("peak sequences at once", fmt.Sprintf("%d (each engine's peak: %s)", run.Peak, peaks(run)))
	rec.Note("mean while requests waited", fmt.Sprintf("%.1f", run.MeanQueued))
	rec.Note("wall time", fmt.Sprintf("%.1f s", run.Wall))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rec.WriteHTML(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// complete posts one request, retrying after a 429's Retry-After, and
// returns its tokens and, where the engine answers them (llamaserve),
// each token's top two logits.
func complete(ctx context.Context, c *http.Client, e engine, prompt []int32, gen int) ([]int32, []top2, int, error) {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": gen, "top2": true})
	for retries := 0; ; retries++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/completions", bytes.NewReader(body))
		if err != nil {
			return nil, nil, retries, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, nil, retries, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			var out struct {
				Choices []struct {
					Tokens []int32 `json:"tokens"`
					Top2   []top2  `json:"top2"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
				return nil, nil, retries, fmt.Errorf("bad answer %q", b)
			}
			return out.Choices[0].Tokens, out.Choices[0].Top2, retries, nil
		case http.StatusTooManyRequests:
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			select {
			case <-ctx.Done():
				return nil, nil, retries, ctx.Err()
			case <-time.After(time.Duration(max(wait, 1)) * time.Second):
			}
		default:
			return nil, nil, retries, fmt.Errorf("%s: %s", resp.Status, b)
		}
	}
}

type serverStats struct {
	Running, Peak           int
	Preemptions, Recomputed int // llamaserve's (0 where the engine has none)
}

func stats(ctx context.Context, c *http.Client, e engine) (serverStats, error) {
	var st serverStats
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/stats", nil)
	resp, err := c.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// audit compares the ledger's charged bytes with the engines' governors'
// once the engines are idle and their settlers have published (the
// ledger's figures lag a process's by up to its poll): it reads both until
// they agree or 5 s pass, and reports the last difference.
func audit(ctx context.Context, c *http.Client, engines []engine, ledger, when string) (Audit, error) {
	var a Audit
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, _, err := xproc.Inspect(ledger)
		if err != nil {
			return a, err
		}
		var sum uint64
		for _, e := range engines {
			n, _, err := governorCharges(ctx, c, e)
			if err != nil {
				return a, err
			}
			sum += uint64(n)
		}
		a = Audit{When: when, Charged: h.Charged, Engines: sum, Drift: max(h.Charged, sum) - min(h.Charged, sum)}
		if a.Drift == 0 || time.Now().After(deadline) {
			return a, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peaks lists each engine's own peak: "gqa 32, tiny 24".
func peaks(r *Run) string {
	var parts []string
	for _, e := range r.Engines {
		parts = append(parts, fmt.Sprintf("%s %d", e.Name, r.PeakBy[e.Name]))
	}
	return strings.Join(parts, ", ")
}
