package clihelp

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestWrapFitsWidth(t *testing.T) {
	s := strings.Repeat("word ", 60) + "averyveryveryverylongwordthatcannotbreakanywhereatallinthisline"
	for _, line := range strings.Split(strings.TrimSuffix(Wrap(s, 40, "> ", "  "), "\n"), "\n") {
		if len(line) > 40 && !strings.Contains(line, "averyvery") {
			t.Errorf("line of %d columns: %q", len(line), line)
		}
	}
	if got := Wrap("", 40, "x", "y"); got != "x\n" {
		t.Errorf("empty: %q", got)
	}
}

func TestFlagsWrapped(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("mechanism", "cpu", "device mechanism: cpu, or cuda where a GPU and its driver are present, a description longer than one line of eighty columns")
	fs.Int("n", 0, "replay only the first `N` requests (0: all)")
	fs.Bool("v", false, "verbose")
	var b bytes.Buffer
	Flags(&b, fs)
	out := b.String()
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if len(line) > Width {
			t.Errorf("line of %d columns: %q", len(line), line)
		}
	}
	for _, want := range []string{"  -mechanism string\n", `(default "cpu")`, "  -n N\n", "  -v\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q missing from:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(default 0)") || strings.Contains(out, "(default false)") {
		t.Errorf("a zero default printed:\n%s", out)
	}
}
