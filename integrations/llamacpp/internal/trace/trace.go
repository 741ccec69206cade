// Package trace reads the LLM request traces the llama.cpp commands replay
// and scales their lengths to a context.
package trace

import (
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Request is one request of a trace: its prompt and generated tokens.
type Request struct{ Prompt, Gen int }

// Read reads the first n requests of a trace CSV (the Azure LLM inference
// trace 2023's format: TIMESTAMP, ContextTokens, GeneratedTokens).
func Read(path string, n int) ([]Request, error) {
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
	var out []Request
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
		out = append(out, Request{p, g})
	}
	return out, nil
}

// Scale makes the longest request fill nCtx; every request keeps at least
// one prompt token and one generated token.
func Scale(rs []Request, nCtx int) []Request {
	longest := 0
	for _, r := range rs {
		longest = max(longest, r.Prompt+r.Gen)
	}
	out := make([]Request, len(rs))
	for i, r := range rs {
		p := max(1, r.Prompt*nCtx/longest)
		g := max(1, r.Gen*nCtx/longest)
		if p+g > nCtx {
			g = nCtx - p
		}
		out[i] = Request{p, g}
	}
	return out
}
