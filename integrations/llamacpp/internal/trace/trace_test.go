package trace

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t.csv")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadAndScale: the first n requests are read by their columns' names
// (a byte-order mark tolerated); Scale makes the longest fill n_ctx and
// keeps a token of each part; bad files are errors naming the line.
func TestReadAndScale(t *testing.T) {
	rs, err := Read(write(t, "\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n0,100,50\n1,300,100\n2,7,1\n"), 2)
	if err != nil || len(rs) != 2 || rs[1] != (Request{300, 100}) {
		t.Fatalf("%v %v", rs, err)
	}
	s := Scale([]Request{{100, 50}, {300, 100}, {1, 0}}, 1024)
	if s[1] != (Request{768, 256}) || s[2] != (Request{2, 1}) {
		t.Errorf("scaled: %v", s)
	}
	for body, want := range map[string]string{
		"a,b\n1,2\n": "no ContextTokens and GeneratedTokens columns",
		"TIMESTAMP,ContextTokens,GeneratedTokens\n0,x,1\n": "line 2: bad token counts",
		"TIMESTAMP,ContextTokens,GeneratedTokens\n0,0,0\n": "line 2: bad token counts",
	} {
		if _, err := Read(write(t, body), 5); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}
