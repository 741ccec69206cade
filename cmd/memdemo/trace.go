package main

import (
	"bufio"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// excerpt is the first 2,000 requests of the Azure LLM inference trace 2023
// (conversation service), published with Patel et al., "Splitwise:
// Efficient generative LLM inference using phase splitting", ISCA 2024;
// licensed CC-BY 4.0. See trace/README.md.
//
//go:embed trace/azure-llm-conv-2023-excerpt.csv
var excerpt string

// excerptName is how the summary names the embedded trace.
const excerptName = "embedded excerpt of the Azure LLM inference trace 2023 (first 2,000 requests; Patel et al., Splitwise, ISCA 2024, CC-BY 4.0)"

// traceTimeLayout is the TIMESTAMP format of the Azure traces; fractional
// seconds of any length parse with it.
const traceTimeLayout = "2006-01-02 15:04:05.999999999"

// Request is one request of the workload.
type Request struct {
	ID      int           // 0-based position in the trace
	Arrival time.Duration // since the trace's first request
	Prompt  int           // ContextTokens: prompt tokens, backed at admission
	Gen     int           // GeneratedTokens: one per decode step
}

// Context returns the request's maximum context: prompt plus generated tokens.
func (r Request) Context() int { return r.Prompt + r.Gen }

// TraceError reports a malformed trace line.
type TraceError struct {
	Source string
	Line   int
	Err    error
}

func (e *TraceError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Source, e.Line, e.Err) }

func (e *TraceError) Unwrap() error { return e.Err }

// ErrTraceFormat is the kind of every TraceError's cause that is not an I/O error.
var ErrTraceFormat = errors.New("malformed trace")

// ParseTrace reads a trace in the Azure LLM trace format: a header naming
// TIMESTAMP, ContextTokens and GeneratedTokens (in any order, other columns
// ignored), then one request per line. Arrivals are made relative to the
// first request and must not go backwards; token counts must be
// non-negative, and a request must have a positive context. limit > 0 stops
// after that many requests.
func ParseTrace(r io.Reader, source string, limit int) ([]Request, error) {
	cr := csv.NewReader(bufio.NewReader(r))
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err == io.EOF {
		return nil, &TraceError{Source: source, Line: 1, Err: fmt.Errorf("%w: empty file", ErrTraceFormat)}
	}
	if err != nil {
		return nil, &TraceError{Source: source, Line: 1, Err: err}
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	iTime, ok1 := col["TIMESTAMP"]
	iCtx, ok2 := col["ContextTokens"]
	iGen, ok3 := col["GeneratedTokens"]
	if !ok1 || !ok2 || !ok3 {
		return nil, &TraceError{Source: source, Line: 1, Err: fmt.Errorf("%w: header %q lacks TIMESTAMP, ContextTokens or GeneratedTokens", ErrTraceFormat, strings.Join(head, ","))}
	}
	need := max(iTime, iCtx, iGen) + 1
	var out []Request
	var first, prev time.Time
	for limit <= 0 || len(out) < limit {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			return nil, &TraceError{Source: source, Line: line, Err: err}
		}
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		bad := func(format string, args ...any) error {
			return &TraceError{Source: source, Line: line, Err: fmt.Errorf("%w: "+format, append([]any{ErrTraceFormat}, args...)...)}
		}
		if len(rec) < need {
			return nil, bad("%d fields, want at least %d", len(rec), need)
		}
		at, err := time.Parse(traceTimeLayout, strings.TrimSpace(rec[iTime]))
		if err != nil {
			return nil, bad("TIMESTAMP %q: %v", rec[iTime], err)
		}
		p, err := strconv.Atoi(strings.TrimSpace(rec[iCtx]))
		if err != nil || p < 0 {
			return nil, bad("ContextTokens %q is not a non-negative integer", rec[iCtx])
		}
		g, err := strconv.Atoi(strings.TrimSpace(rec[iGen]))
		if err != nil || g < 0 {
			return nil, bad("GeneratedTokens %q is not a non-negative integer", rec[iGen])
		}
		if p+g == 0 {
			return nil, bad("a request with no tokens")
		}
		if len(out) == 0 {
			first, prev = at, at
		}
		if at.Before(prev) {
			return nil, bad("TIMESTAMP %s is before the previous request's %s", rec[iTime], prev.Format(traceTimeLayout))
		}
		prev = at
		out = append(out, Request{ID: len(out), Arrival: at.Sub(first), Prompt: p, Gen: g})
	}
	if len(out) == 0 {
		return nil, &TraceError{Source: source, Line: 2, Err: fmt.Errorf("%w: no requests", ErrTraceFormat)}
	}
	return out, nil
}

// LoadTrace reads the trace at path, or the embedded excerpt when path is
// empty. It returns the requests and a name for the summary. A missing file
// is an error that says where the trace is expected.
func LoadTrace(path string, limit int) ([]Request, string, error) {
	if path == "" {
		reqs, err := ParseTrace(strings.NewReader(excerpt), "embedded excerpt", limit)
		return reqs, excerptName, err
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("--trace %s: not found (without --trace the demo replays its embedded excerpt; README.md says where the full trace comes from): %w", path, err)
	}
	if err != nil {
		return nil, "", fmt.Errorf("--trace %s: %w", path, err)
	}
	defer f.Close()
	reqs, err := ParseTrace(f, path, limit)
	return reqs, path, err
}
