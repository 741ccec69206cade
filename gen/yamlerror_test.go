package gen

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// A key indented one column less than its siblings deep in the real spec is
// reported at its own line and column, not at the line where the
// enclosing section's mapping begins (the parser's answer, hundreds of
// lines above).
func TestYAMLErrorAtTheBadLine(t *testing.T) {
	data, err := os.ReadFile("../spec/capabilities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	bad := -1
	for i := len(lines) - 1; i >= 0; i-- { // the last mechanism's type, deep in the file
		if strings.HasPrefix(lines[i], "    type: ") && i > 300 {
			bad = i
			break
		}
	}
	if bad < 0 {
		t.Fatal("no mechanism type line past line 300 in the spec")
	}
	lines[bad] = lines[bad][1:]
	_, err = Load("spec/capabilities.yaml", []byte(strings.Join(lines, "")))
	want := fmt.Sprintf("spec/capabilities.yaml:%d:4: yaml: did not find expected key", bad+1)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v, want it to begin %q", err, want)
	}
}
