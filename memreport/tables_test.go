package memreport

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The program's tables come first on the page, before any chart or events
// table, and travel in the JSON snapshot, padded and keyed in snake_case.
func TestTablesAtTheTop(t *testing.T) {
	rec, _ := fullScenario(t)
	var page bytes.Buffer
	require.NoError(t, rec.WriteHTML(&page))
	html := page.String()
	at := strings.Index(html, `<table class="program" data-key="comparison">`)
	require.Positive(t, at, "the comparison table is on the page")
	for _, later := range []string{"<svg", `<table class="events"`, `<table class="notes"`, `class="toggles"`} {
		i := strings.Index(html, later)
		require.Positive(t, i, later)
		require.Less(t, at, i, "the table comes before %s", later)
	}
	require.Contains(t, html, "<h2>memgen against the baselines</h2>")
	require.Contains(t, html, "<td>1.02x</td>")

	var js bytes.Buffer
	require.NoError(t, rec.WriteJSON(&js))
	var rep Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &rep))
	require.Len(t, rep.Tables, 1)
	require.Equal(t, "comparison", rep.Tables[0].Key)
	require.Equal(t, []string{"static-max", "1", ""}, rep.Tables[0].Rows[1], "a short row is padded")
}

// The page opens with the verdict of the program's checks, then its
// tables, then the checks one by one, then the charts; a failed check is
// named in the verdict.
func TestVerdictFirstThenComparisonThenChecks(t *testing.T) {
	rec, _ := fullScenario(t)
	rec.Check("Requests served", true, "42 of 42")
	page := func() string {
		var b bytes.Buffer
		require.NoError(t, rec.WriteHTML(&b))
		return b.String()
	}
	html := page()
	order := []string{`<h1>`, `<p class="verdict pass" id="verdict">PASS: all 2 checks passed</p>`,
		`<table class="program" data-key="comparison">`, `<table class="checks">`, `class="toggles"`, "<svg", `<table class="notes"`}
	at := -1
	for _, s := range order {
		i := strings.Index(html, s)
		require.Positive(t, i, s)
		require.Less(t, at, i, "%s is out of order", s)
		at = i
	}
	rec.Check("Leaked handles", false, "3 handles left open")
	html = page()
	require.Contains(t, html, `<p class="verdict fail" id="verdict">FAIL: 1 of 3 checks failed: Leaked handles</p>`)
	require.Contains(t, html, `<tr data-key="leaked_handles"><td class="fail">FAIL</td>`)
	var empty bytes.Buffer
	require.NoError(t, New(Options{}).WriteHTML(&empty))
	require.NotContains(t, empty.String(), `class="verdict`, "no checks, no verdict")
}
