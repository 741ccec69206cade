package llamacpp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memgen/memgen/internal/watchdog"
)

// post sends a JSON body and returns the status, the headers and the body.
// The exchange is bounded by the watchdog: a server that never answers
// fails the test with every goroutine's stack.
func post(t *testing.T, url, body string) (int, http.Header, []byte) {
	t.Helper()
	var resp *http.Response
	var b []byte
	var err error
	watchdog.Within(t, watchdog.Bound, "POST "+url, func() {
		resp, err = http.Post(url, "application/json", strings.NewReader(body))
		if err == nil {
			defer resp.Body.Close()
			b, err = io.ReadAll(resp.Body)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

type completion struct {
	Choices []struct {
		Text         string  `json:"text"`
		Tokens       []int32 `json:"tokens"`
		FinishReason string  `json:"finish_reason"`
		Message      struct {
			Role, Content string
		} `json:"message"`
		Delta struct{ Content string } `json:"delta"`
		Top2  [][3]float64             `json:"top2"`
	} `json:"choices"`
	Usage struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message, Type, Param string
	} `json:"error"`
}

// newTestServer serves the GQA model (a real vocabulary) on memgen's
// device through httptest.
func newTestServer(t *testing.T, opts ServerOptions) (*Server, *httptest.Server, *rig, *Model) {
	t.Helper()
	r := newRig(t, 1<<30)
	m := loadModelAt(t, gqaModelPath, r.options())
	s, err := NewServer(context.Background(), m, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, serve(t, s), r, m
}

// serve serves s through httptest until the test ends, then closes both.
func serve(t *testing.T, s *Server) *httptest.Server {
	t.Helper()
	hs := httptest.NewServer(s.Handler(nil))
	t.Cleanup(func() {
		hs.Close()
		if err := s.Close(context.Background()); err != nil && !isClosed(err) {
			t.Error(err)
		}
	})
	return hs
}

// greedyTokens decodes prompt and n greedy tokens on a context of its own.
func greedyTokens(t *testing.T, m *Model, prompt []int32, n int) []int32 {
	t.Helper()
	c, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(bg(t))
	var out []int32
	toks := prompt
	for range n {
		next, err := c.Decode(bg(t), toks)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, next)
		toks = []int32{next}
	}
	return out
}

// TestServerCompletions: a completion of a text prompt gives the greedy
// tokens a context of its own gives, with their text and usage; the same
// request streamed gives them as server-sent events ending in [DONE]; a
// chat completion formats the messages with the model's template; token
// ids are a prompt too; /v1/models and /health answer. Once every request
// is done the context holds no KV: the ledger is the weights and the
// compute buffers.
func TestServerCompletions(t *testing.T) {
	s, hs, r, m := newTestServer(t, ServerOptions{Sequences: 4, NCtx: 512})
	code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 12}`)
	var c completion
	if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
		t.Fatalf("completion: %d %s", code, body)
	}
	prompt, err := m.Tokenize("The ledger is", true)
	if err != nil {
		t.Fatal(err)
	}
	want := greedyTokens(t, m, prompt, 12)
	ch := c.Choices[0]
	if hashTokens(ch.Tokens) != hashTokens(want) || ch.FinishReason != "length" || c.Usage.Prompt != len(prompt) || c.Usage.Completion != 12 {
		t.Errorf("completion %+v: want the tokens %v, finish length, usage %d + 12", c, want, len(prompt))
	}
	var text strings.Builder
	for _, tok := range want {
		p, _ := m.Piece(tok)
		text.WriteString(p)
	}
	if ch.Text != text.String() {
		t.Errorf("text %q, want %q", ch.Text, text.String())
	}
	t.Logf("completion: %q (tokens %v)", ch.Text, ch.Tokens)

	// Streamed: the same tokens, one event each, then the end and [DONE].
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": "The ledger is", "max_tokens": 12, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, ct)
	}
	var streamed []int32
	var streamedText strings.Builder
	done, reason := false, ""
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ev completion
		if err := json.Unmarshal([]byte(line), &ev); err != nil || len(ev.Choices) != 1 {
			t.Fatalf("event %q: %v", line, err)
		}
		streamed = append(streamed, ev.Choices[0].Tokens...)
		streamedText.WriteString(ev.Choices[0].Text)
		if ev.Choices[0].FinishReason != "" {
			reason = ev.Choices[0].FinishReason
		}
	}
	resp.Body.Close()
	if !done || reason != "length" || hashTokens(streamed) != hashTokens(want) || streamedText.String() != text.String() {
		t.Errorf("stream: done %v, reason %q, tokens %v, text %q", done, reason, streamed, streamedText.String())
	}

	// The top logits: per token its logit above the runner-up's (another
	// token of the vocabulary), the first token's exactly what a context
	// of its own computes for the prompt alone.
	code, _, body = post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 12, "top2": true}`)
	if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Choices[0].Top2) != 12 || hashTokens(c.Choices[0].Tokens) != hashTokens(want) {
		t.Fatalf("top2: %d %s", code, body)
	}
	for i, tp := range c.Choices[0].Top2 {
		if tp[0] <= tp[2] || int32(tp[1]) == c.Choices[0].Tokens[i] || tp[1] < 0 || int(tp[1]) >= m.NVocab() {
			t.Errorf("token %d (%d): top2 %v: not a logit above another token's", i, c.Choices[0].Tokens[i], tp)
		}
	}
	ctx1, err := m.NewContext(bg(t), ContextOptions{NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	var top TopLogits
	if _, err := ctx1.DecodeBatch(bg(t), []SeqTokens{{Seq: 0, Tokens: prompt, Top: &top}}); err != nil {
		t.Fatal(err)
	}
	ctx1.Close(bg(t))
	if got := c.Choices[0].Top2[0]; got != [3]float64{float64(top.Logit), float64(top.Second), float64(top.SecondLogit)} {
		t.Errorf("the first token's top2 %v, a context of its own %+v", got, top)
	}
	if code, _, _ := post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 2, "top2": true, "stream": true}`); code != http.StatusBadRequest {
		t.Errorf("top2 streamed: %d, want 400", code)
	}

	// Token ids, and a chat.
	ids, _ := json.Marshal(prompt)
	if code, _, body := post(t, hs.URL+"/v1/completions", fmt.Sprintf(`{"prompt": %s, "max_tokens": 12}`, ids)); code != http.StatusOK ||
		json.Unmarshal(body, &c) != nil || hashTokens(c.Choices[0].Tokens) != hashTokens(want) {
		t.Errorf("token ids: %d %s", code, body)
	}
	code, _, body = post(t, hs.URL+"/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 5, "temperature": 0.8, "seed": 3}`)
	if code != http.StatusOK || json.Unmarshal(body, &c) != nil || c.Choices[0].Message.Role != "assistant" || c.Usage.Completion == 0 {
		t.Errorf("chat: %d %s", code, body)
	}
	for _, p := range []string{"/v1/models", "/health"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(`"memgen"`)) && !bytes.Contains(b, []byte(`"ok"`)) {
			t.Errorf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	resp, err = http.Get(hs.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st ServerStats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/stats: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if st.Served < 4 || st.Running != 0 || st.Peak < 1 || st.Sequences != s.opts.Sequences || st.Budget != s.opts.Budget || st.Admitted != 0 {
		t.Errorf("/stats after the requests: %+v", st)
	}
	r.settle(t)
	if kv := s.c.KV(); kv.Committed != 0 || kv.Cells != 0 {
		t.Errorf("after the requests the context holds %+v", kv)
	}
	r.audit(t, "after the requests", m, s.c)
}

// TestServerRefusals: bad requests are 400 with the field named; a request
// the budget cannot take within the queue timeout is 429 with a JSON error
// and Retry-After while another holds the budget; after Close, /health and
// completions are 503.
func TestServerRefusals(t *testing.T) {
	r := newRig(t, 1<<30)
	m := loadModelAt(t, gqaModelPath, r.options())
	probe, err := NewServer(context.Background(), m, ServerOptions{Sequences: 2, NCtx: 512})
	if err != nil {
		t.Fatal(err)
	}
	budget := probe.kvNeed(400)
	if err := probe.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(context.Background(), m, ServerOptions{Sequences: 2, NCtx: 512, Budget: budget, QueueTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler(nil))
	defer hs.Close()
	for _, c := range []struct{ body, param string }{
		{`{"prompt": "x"`, "body"},
		{`{"max_tokens": 4}`, "prompt"},
		{`{"prompt": [1, 99999999]}`, "prompt"},
		{`{"prompt": "x", "max_tokens": 600}`, "max_tokens"},
		{`{"prompt": "x", "max_tokens": 0}`, "max_tokens"},
		{`{"prompt": "x", "temperature": 5}`, "temperature"},
		{`{"prompt": "x", "temperature": 1, "seed": -1}`, "seed"},
		{`{"prompt": "x", "model": "gpt-4"}`, "model"},
	} {
		code, _, body := post(t, hs.URL+"/v1/completions", c.body)
		var e completion
		if code != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Param != c.param {
			t.Errorf("%s: %d %s, want 400 naming %s", c.body, code, body, c.param)
		}
	}
	if code, _, body := post(t, hs.URL+"/v1/chat/completions", `{"messages": []}`); code != http.StatusBadRequest {
		t.Errorf("no messages: %d %s", code, body)
	}
	// One request of 300 tokens holds the budget while it decodes; the
	// next, of 300 too, waits 200 ms and is refused.
	first := make(chan int, 1)
	go func() {
		resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt": [1, 2, 3], "max_tokens": 300}`))
		if err != nil {
			first <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		used := s.used
		s.mu.Unlock()
		if used > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	code, hdr, body := post(t, hs.URL+"/v1/completions", `{"prompt": [1, 2, 3], "max_tokens": 300}`)
	var e completion
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Type != "rate_limit_exceeded" {
		t.Errorf("over the budget: %d (Retry-After %q) %s, want 429", code, hdr.Get("Retry-After"), body)
	}
	if c := <-first; c != http.StatusOK {
		t.Errorf("the first request: %d", c)
	}
	if err := s.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	if code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": [1], "max_tokens": 2}`); code != http.StatusServiceUnavailable {
		t.Errorf("after Close: %d %s", code, body)
	}
	resp, err := http.Get(hs.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/health after Close: %d", resp.StatusCode)
	}
	r.settle(t)
	r.audit(t, "after Close", m)
}

// TestServerPrefillsApart: each step decodes the running sequences' next
// tokens in one call, in decreasing order of their sequences, and each
// new prompt in a call of its own, never a prompt beside decode tokens
// (which would move the decode tokens onto ggml's tiled attention path,
// at 64 queries, and change their rounding). Eight requests with prompts
// of 80 tokens arrive while others decode, on four sequences (so that
// freed sequences are taken again out of order).
func TestServerPrefillsApart(t *testing.T) {
	var mu sync.Mutex
	var calls [][]int // per DecodeBatch call, each entry's token count
	var order [][]int // per call of several entries, their sequences
	stepCall = func(in []SeqTokens) {
		n := make([]int, len(in))
		seqs := make([]int, len(in))
		for i, e := range in {
			n[i], seqs[i] = len(e.Tokens), e.Seq
		}
		mu.Lock()
		calls = append(calls, n)
		if len(in) > 1 {
			order = append(order, seqs)
		}
		mu.Unlock()
	}
	t.Cleanup(func() { stepCall = nil })
	_, hs, _, _ := newTestServer(t, ServerOptions{Sequences: 4, NCtx: 512})
	ids := make([]string, 80)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i)
	}
	var wg sync.WaitGroup
	for k := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(k) * 20 * time.Millisecond)
			if code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": [`+strings.Join(ids, ",")+`], "max_tokens": 24}`); code != http.StatusOK {
				t.Errorf("request %d: %d %s", k, code, body)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	prompts, decodes := 0, 0
	for _, seqs := range order {
		if !slices.IsSortedFunc(seqs, func(a, b int) int { return b - a }) {
			t.Errorf("a decode step of sequences %v: not in decreasing order", seqs)
		}
	}
	for _, c := range calls {
		switch {
		case len(c) == 1 && c[0] == len(ids):
			prompts++
		case slices.Max(c) == 1:
			decodes++
		default:
			t.Errorf("a call of entries of %v tokens: a prompt beside other entries", c)
		}
	}
	if prompts != 8 || decodes < 23 {
		t.Errorf("%d prompt calls (want 8), %d decode calls", prompts, decodes)
	}
}

// TestServerLoad: 64 clients send completions without pause (a refused
// one retries after 5 ms) for LLAMACPP_LOAD_SECONDS (default 10; `make
// llamacpp-load` runs 60) to the tiny model served with 16 sequences and
// a budget for 16 requests. Every answer is a completion or a 429; every
// 429 was sent while every sequence or the budget was taken
// (RefusedWithRoom 0); the sequences were held at least 90 % of the time
// (the completions the budget allows, served); once the server is closed
// the ledger holds the weights only, and no goroutine is left (TestMain).
func TestServerLoad(t *testing.T) {
	seconds := 10
	if v := os.Getenv("LLAMACPP_LOAD_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("LLAMACPP_LOAD_SECONDS=%q", v)
		}
		seconds = n
	}
	const clients, seqs, maxLen = 64, 16, 128
	r := newRig(t, 1<<30)
	m := loadModel(t, r.options())
	probe, err := NewServer(context.Background(), m, ServerOptions{Sequences: seqs, NCtx: 256})
	if err != nil {
		t.Fatal(err)
	}
	budget := seqs * probe.kvNeed(maxLen)
	if err := probe.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(context.Background(), m, ServerOptions{Sequences: seqs, NCtx: 256, Budget: budget, QueueTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler(nil))
	defer hs.Close()
	var refusedWithRoom atomic.Int64
	refused = func(room bool) {
		if room {
			refusedWithRoom.Add(1)
		}
	}
	defer func() { refused = nil }()
	start := time.Now()
	end := start.Add(time.Duration(seconds) * time.Second)
	type tally struct{ ok, busy, other int }
	results := make(chan tally, clients)
	for i := range clients {
		go func() {
			var n tally
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for time.Now().Before(end) {
				p := prompt(i, 16+rng.IntN(48), m.NVocab())
				ids, _ := json.Marshal(p)
				body := fmt.Sprintf(`{"prompt": %s, "max_tokens": %d}`, ids, 16+rng.IntN(maxLen-64-16))
				resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					n.other++
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					n.ok++
				case http.StatusTooManyRequests:
					n.busy++
					time.Sleep(5 * time.Millisecond)
				default:
					n.other++
				}
			}
			results <- n
		}()
	}
	var all tally
	for range clients {
		n := <-results
		all.ok, all.busy, all.other = all.ok+n.ok, all.busy+n.busy, all.other+n.other
	}
	elapsed := time.Since(start)
	st := s.Stats()
	if err := s.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	util := st.SlotTime.Seconds() / (seqs * elapsed.Seconds())
	t.Logf("%d clients, %v: %d completions, %d refused (429), %d other; server: served %d, failed %d, refused %d (with room %d); sequences busy %.1f %% of the time",
		clients, elapsed.Round(time.Millisecond), all.ok, all.busy, all.other, st.Served, st.Failed, st.Refused, refusedWithRoom.Load(), 100*util)
	if all.other != 0 || st.Failed != 0 || int64(all.ok) != st.Served || int64(all.busy) != st.Refused {
		t.Errorf("answers other than a completion or a 429: %d (failed %d); served %d of %d, refused %d of %d", all.other, st.Failed, st.Served, all.ok, st.Refused, all.busy)
	}
	if n := refusedWithRoom.Load(); n != 0 {
		t.Errorf("%d requests were refused while a sequence and the budget were free", n)
	}
	if util < 0.9 && !raceEnabled {
		t.Errorf("the sequences were busy %.1f %% of the time, not 90 %%", 100*util)
	}
	r.settle(t)
	r.audit(t, "after the load", m)
}

// TestStockServer: a stock model (llama.cpp's own KV cache, every
// sequence's n_ctx allocated with the context, as llama-server does) is
// served too, admitted by free sequence alone, and its completions are
// the greedy tokens of a stock context of its own.
func TestStockServer(t *testing.T) {
	m := loadModelAt(t, gqaModelPath, Options{Stock: true})
	s, err := NewServer(context.Background(), m, ServerOptions{Sequences: 2, NCtx: 512, Budget: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler(nil))
	defer hs.Close()
	defer func() {
		if err := s.Close(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	prompt, err := m.Tokenize("The ledger is", true)
	if err != nil {
		t.Fatal(err)
	}
	want := greedyTokens(t, m, prompt, 10)
	for i := range 3 {
		code, _, body := post(t, hs.URL+"/v1/completions", `{"prompt": "The ledger is", "max_tokens": 10}`)
		var c completion
		if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("completion %d: %d %s", i, code, body)
		}
		if hashTokens(c.Choices[0].Tokens) != hashTokens(want) {
			t.Errorf("completion %d: tokens %v, want a stock context's %v", i, c.Choices[0].Tokens, want)
		}
	}
	if st := s.Stats(); st.Served != 3 || st.Budget != 0 || st.Admitted != 0 || st.Running != 0 {
		t.Errorf("stats %+v: want 3 served, no budget read, nothing running", st)
	}
}
