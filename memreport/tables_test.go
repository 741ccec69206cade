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
