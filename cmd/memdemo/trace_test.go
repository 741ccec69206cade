package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fullTrace is the production trace, relative to this package.
var fullTrace = filepath.Join("..", "..", "..", "shared", "traces", "azure-llm-conv-2023.csv")

func TestEmbeddedExcerpt(t *testing.T) {
	reqs, name, err := LoadTrace("", 0)
	require.NoError(t, err)
	require.Contains(t, name, "Splitwise")
	require.Contains(t, name, "CC-BY 4.0")
	require.Len(t, reqs, 2000, "the excerpt is the trace's first 2,000 requests")
	require.Equal(t, Request{ID: 0, Arrival: 0, Prompt: 374, Gen: 44}, reqs[0])
	// 18:15:50.9951690 - 18:15:46.6805900
	require.Equal(t, Request{ID: 1, Arrival: 4314579 * time.Microsecond, Prompt: 396, Gen: 109}, reqs[1])
	for i := 1; i < len(reqs); i++ {
		require.GreaterOrEqual(t, reqs[i].Arrival, reqs[i-1].Arrival)
		require.Equal(t, i, reqs[i].ID)
	}
	// The attribution sits beside the excerpt.
	readme, err := os.ReadFile(filepath.Join("trace", "README.md"))
	require.NoError(t, err)
	for _, s := range []string{"Azure LLM inference trace 2023", "Splitwise", "ISCA 2024", "Patel et al.", "CC-BY 4.0"} {
		require.Contains(t, string(readme), s)
	}
	limited, _, err := LoadTrace("", 10)
	require.NoError(t, err)
	require.Equal(t, reqs[:10], limited)
}

func TestFullTraceMatchesExcerpt(t *testing.T) {
	if _, err := os.Stat(fullTrace); err != nil {
		t.Skipf("full trace %s absent: %v", fullTrace, err)
	}
	full, _, err := LoadTrace(fullTrace, 0)
	require.NoError(t, err)
	require.Greater(t, len(full), 19000)
	ex, _, err := LoadTrace("", 0)
	require.NoError(t, err)
	require.Equal(t, ex, full[:len(ex)])
}

func TestParseTrace(t *testing.T) {
	in := "GeneratedTokens,extra,TIMESTAMP,ContextTokens\n" +
		"5,x,2023-11-16 18:00:00.5,100\n" +
		"\n" +
		"0,y,2023-11-16 18:00:01,7\n" +
		"3,z,2023-11-16 18:00:01,0\n"
	reqs, err := ParseTrace(strings.NewReader(in), "t.csv", 0)
	require.NoError(t, err)
	require.Equal(t, []Request{
		{ID: 0, Arrival: 0, Prompt: 100, Gen: 5},
		{ID: 1, Arrival: 500 * time.Millisecond, Prompt: 7, Gen: 0},
		{ID: 2, Arrival: 500 * time.Millisecond, Prompt: 0, Gen: 3},
	}, reqs)
	require.Equal(t, 105, reqs[0].Context())
}

func TestParseTraceErrors(t *testing.T) {
	const head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for _, c := range []struct {
		name, in string
		line     int
		want     string
	}{
		{"empty", "", 1, "empty file"},
		{"header", "TIME,ContextTokens,GeneratedTokens\n", 1, "lacks TIMESTAMP"},
		{"no requests", head, 2, "no requests"},
		{"short line", head + "2023-11-16 18:00:00,1\n", 2, "2 fields"},
		{"bad time", head + "yesterday,1,1\n", 2, "TIMESTAMP"},
		{"bad prompt", head + "2023-11-16 18:00:00,-3,1\n", 2, "ContextTokens"},
		{"bad generated", head + "2023-11-16 18:00:00,3,many\n", 2, "GeneratedTokens"},
		{"no tokens", head + "2023-11-16 18:00:00,0,0\n", 2, "no tokens"},
		{"backwards", head + "2023-11-16 18:00:01,1,1\n2023-11-16 18:00:00,1,1\n", 3, "before the previous"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(c.in), "t.csv", 0)
			var te *TraceError
			require.ErrorAs(t, err, &te)
			require.ErrorIs(t, err, ErrTraceFormat)
			require.Equal(t, c.line, te.Line)
			require.Equal(t, "t.csv", te.Source)
			require.Contains(t, err.Error(), c.want)
		})
	}
}

func TestLoadTraceMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.csv")
	_, _, err := LoadTrace(path, 0)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.True(t, strings.HasPrefix(err.Error(), "--trace "+path+": not found"), err.Error())
	require.NotContains(t, err.Error(), "shared/traces", "the path given, no other")
	require.Contains(t, err.Error(), "without --trace")
	require.False(t, errors.Is(err, ErrTraceFormat))
}
