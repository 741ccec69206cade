package llamacpp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/memgen/memgen/generated/memapi"
)

// Handler is the server's HTTP API, a thin OpenAI-style surface over the
// engine:
//
//   - POST /v1/completions: a prompt (text, or token ids), max_tokens,
//     temperature (0: greedy) and seed; with "stream": true the tokens come
//     as server-sent events ("data: {...}", then "data: [DONE]"); with
//     "top2": true (greedy, not streamed) the choice also has "top2": per
//     token its logit, the runner-up token and the runner-up's logit, so
//     that a client can see how close each choice was;
//   - POST /v1/chat/completions: messages formatted with the model's chat
//     template, otherwise the same;
//   - GET /v1/models: the model;
//   - GET /health: 200 while serving, 503 once closing or failed;
//   - GET /stats: the server's counters (ServerStats) as JSON: requests
//     served, failed and refused, the sequences running now and at the
//     peak, the KV budget and the part of it admitted;
//   - GET /metrics: metrics, when given (the governor's ledger through
//     promgov in llamaserve).
//
// A request the budget cannot take within the queue timeout is answered
// 429 with a JSON error and Retry-After; one while the server is closing or
// after the engine failed, 503; a bad request, 400 with the field named.
func (s *Server) Handler(metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, true) })
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.Stats()) })
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}

// completionRequest is the body of both completion endpoints.
type completionRequest struct {
	Model       string          `json:"model"`
	Prompt      json.RawMessage `json:"prompt"`   // a string or token ids (completions)
	Messages    []ChatMessage   `json:"messages"` // chat
	MaxTokens   *int            `json:"max_tokens"`
	Temperature *float64        `json:"temperature"`
	Seed        *int64          `json:"seed"`
	Stream      bool            `json:"stream"`
	// Top2 asks for each generated token's logit and the runner-up's
	// (greedy decoding only): "top2": [[logit, runner-up, its logit], ...].
	Top2 bool `json:"top2"`
}

// apiError is an error answered as JSON: {"error": {...}}.
type apiError struct {
	status int
	Msg    string `json:"message"`
	Type   string `json:"type"`
	Param  string `json:"param,omitempty"`
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Msg: param + ": " + fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) fail(w http.ResponseWriter, e *apiError) {
	if e.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(s.opts.QueueTimeout/time.Second))))
	}
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

var completionIDs atomic.Int64

// parse reads and checks a request, and returns its prompt's tokens, its
// max_tokens and its sampler (nil: greedy; the caller closes it).
func (s *Server) parse(r *http.Request, chat bool) (*completionRequest, []int32, int, *Sampler, *apiError) {
	var req completionRequest
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 8<<20))
	if err := dec.Decode(&req); err != nil {
		return nil, nil, 0, nil, badRequest("body", "not a JSON request: %v", err)
	}
	if req.Top2 && (req.Stream || req.Temperature != nil && *req.Temperature != 0) {
		return nil, nil, 0, nil, badRequest("top2", "the runner-up logits are answered for greedy requests that are not streamed")
	}
	if req.Model != "" && req.Model != s.opts.Name {
		return nil, nil, 0, nil, badRequest("model", "%q is not served here (%q is)", req.Model, s.opts.Name)
	}
	var prompt []int32
	switch {
	case chat:
		if len(req.Messages) == 0 {
			return nil, nil, 0, nil, badRequest("messages", "no messages")
		}
		text, err := s.m.ApplyChatTemplate(req.Messages)
		if err != nil {
			return nil, nil, 0, nil, badRequest("messages", "%v", err)
		}
		if prompt, err = s.m.Tokenize(text, true); err != nil {
			return nil, nil, 0, nil, badRequest("messages", "%v", err)
		}
	case len(req.Prompt) == 0:
		return nil, nil, 0, nil, badRequest("prompt", "missing")
	default:
		var text string
		if err := json.Unmarshal(req.Prompt, &text); err == nil {
			if !s.m.HasTokenizer() {
				return nil, nil, 0, nil, badRequest("prompt", "the model has no tokenizer: send token ids")
			}
			if prompt, err = s.m.Tokenize(text, true); err != nil {
				return nil, nil, 0, nil, badRequest("prompt", "%v", err)
			}
		} else if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
			return nil, nil, 0, nil, badRequest("prompt", "neither text nor token ids")
		}
		for _, t := range prompt {
			if t < 0 || int(t) >= s.m.NVocab() {
				return nil, nil, 0, nil, badRequest("prompt", "token %d is outside the vocabulary of %d", t, s.m.NVocab())
			}
		}
	}
	if len(prompt) == 0 {
		return nil, nil, 0, nil, badRequest("prompt", "no tokens")
	}
	maxTokens := s.opts.MaxTokens
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if maxTokens < 1 || len(prompt)+maxTokens > s.opts.NCtx {
		return nil, nil, 0, nil, badRequest("max_tokens", "%d with a prompt of %d tokens: from 1 to %d tokens in all", maxTokens, len(prompt), s.opts.NCtx)
	}
	var sampler *Sampler
	if req.Temperature != nil && *req.Temperature != 0 {
		if *req.Temperature < 0 || *req.Temperature > 2 {
			return nil, nil, 0, nil, badRequest("temperature", "%g: from 0 (greedy) to 2", *req.Temperature)
		}
		seed := int64(0)
		if req.Seed != nil {
			seed = *req.Seed
		}
		if seed < 0 || seed > 1<<32-1 {
			return nil, nil, 0, nil, badRequest("seed", "%d: from 0 to 2^32-1", seed)
		}
		var err error
		if sampler, err = NewSampler(float32(*req.Temperature), uint32(seed)); err != nil {
			return nil, nil, 0, nil, &apiError{status: http.StatusInternalServerError, Type: "server_error", Msg: err.Error()}
		}
	}
	return &req, prompt, maxTokens, sampler, nil
}

// complete serves both completion endpoints.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	req, prompt, maxTokens, sampler, e := s.parse(r, chat)
	if e != nil {
		s.fail(w, e)
		return
	}
	if sampler != nil {
		defer sampler.Close()
	}
	j, err := s.admit(r.Context(), prompt, maxTokens, sampler)
	switch {
	case errors.Is(err, ErrBusy):
		s.fail(w, &apiError{status: http.StatusTooManyRequests, Type: "rate_limit_exceeded",
			Msg: fmt.Sprintf("every sequence or the KV budget was taken for %v; retry later", s.opts.QueueTimeout)})
		return
	case errors.Is(err, memapi.ErrInvalidSize):
		s.fail(w, badRequest("max_tokens", "%v", err))
		return
	case err != nil:
		s.fail(w, &apiError{status: http.StatusServiceUnavailable, Type: "unavailable", Msg: err.Error()})
		return
	}
	id, object := fmt.Sprintf("cmpl-%d", completionIDs.Add(1)), "text_completion"
	if chat {
		id, object = "chat"+id, "chat.completion"
	}
	created := time.Now().Unix()
	var text utf8Buffer
	choice := func(piece string, reason *string, toks []int32) map[string]any {
		c := map[string]any{"index": 0, "finish_reason": reason}
		switch {
		case chat && req.Stream:
			c["delta"] = map[string]string{"content": piece}
		case chat:
			c["message"] = map[string]string{"role": "assistant", "content": piece}
		default:
			c["text"] = piece
		}
		if toks != nil {
			c["tokens"] = toks
		}
		return c
	}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		flush := func() {
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
		for ev := range j.events {
			if ev.end {
				if ev.err != nil {
					fmt.Fprintf(w, "data: %s\n\n", mustJSON(map[string]any{"error": &apiError{Type: "server_error", Msg: ev.err.Error()}}))
				} else {
					reason := ev.reason
					fmt.Fprintf(w, "data: %s\n\n", mustJSON(map[string]any{"id": id, "object": object + ".chunk", "created": created, "model": s.opts.Name,
						"choices": []any{choice(text.flush(), &reason, nil)}}))
				}
				fmt.Fprint(w, "data: [DONE]\n\n")
				flush()
				return
			}
			piece := s.piece(ev.token, &text)
			fmt.Fprintf(w, "data: %s\n\n", mustJSON(map[string]any{"id": id, "object": object + ".chunk", "created": created, "model": s.opts.Name,
				"choices": []any{choice(piece, nil, []int32{ev.token})}}))
			flush()
		}
		return
	}
	var out []byte
	var toks []int32
	var top2 [][3]float64
	for ev := range j.events {
		if ev.end {
			if ev.err != nil {
				s.fail(w, &apiError{status: http.StatusServiceUnavailable, Type: "unavailable", Msg: ev.err.Error()})
				return
			}
			out = append(out, text.flush()...)
			reason := ev.reason
			c := choice(string(out), &reason, toks)
			if req.Top2 {
				c["top2"] = top2
			}
			writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": object, "created": created, "model": s.opts.Name,
				"choices": []any{c},
				"usage":   map[string]int{"prompt_tokens": len(prompt), "completion_tokens": len(toks), "total_tokens": len(prompt) + len(toks)}})
			return
		}
		toks = append(toks, ev.token)
		top2 = append(top2, [3]float64{float64(ev.top.Logit), float64(ev.top.Second), float64(ev.top.SecondLogit)})
		out = append(out, s.piece(ev.token, &text)...)
	}
}

// piece is the text a token adds (none for a model without a tokenizer),
// held back until it completes a UTF-8 character.
func (s *Server) piece(t int32, b *utf8Buffer) string {
	if !s.m.HasTokenizer() || s.m.IsEndOfGeneration(t) {
		return ""
	}
	p, err := s.m.Piece(t)
	if err != nil {
		return ""
	}
	return b.add(p)
}

// utf8Buffer holds the bytes of an incomplete UTF-8 character between
// tokens.
type utf8Buffer struct{ pending []byte }

// add returns what of the pending bytes and p is whole characters, keeping
// an incomplete last one (at most 3 bytes) for the next piece.
func (b *utf8Buffer) add(p string) string {
	buf := append(b.pending, p...)
	cut := len(buf)
	for i := len(buf) - 1; i >= 0 && i >= len(buf)-3; i-- {
		if utf8.RuneStart(buf[i]) {
			if !utf8.FullRune(buf[i:]) {
				cut = i
			}
			break
		}
	}
	b.pending = append([]byte(nil), buf[cut:]...)
	return string(buf[:cut])
}

// flush returns what is pending (an incomplete character becomes U+FFFD in
// JSON).
func (b *utf8Buffer) flush() string {
	s := string(b.pending)
	b.pending = nil
	return s
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only maps, strings and numbers are encoded
	}
	return b
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": s.opts.Name, "object": "model", "owned_by": "memgen", "created": 0},
	}})
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	state := s.state
	s.mu.Unlock()
	if state != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": state.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}
