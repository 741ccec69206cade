package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestComparePrintsSideBySide: the summary line carries the shared run's
// figures, the tokens identical between the runs, and the largest plan
// error by magnitude; the stock starts and each request that differs are
// listed.
func TestComparePrintsSideBySide(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r Run) string {
		p := filepath.Join(dir, name)
		b, _ := json.Marshal(r)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	engines := []engine{{"tiny", "u1"}, {"gqa", "u2"}}
	shared := write("shared.json", Run{Engines: engines, Requests: 3, Served: 3, Peak: 6, MeanQueued: 4,
		Tokens: [][]int32{{1, 2, 3}, {4, 5}, {6}}, Audits: []Audit{{Drift: 0}, {Drift: 4096}}})
	static := write("static.json", Run{Engines: engines, Requests: 3, Served: 3, Peak: 2, MeanQueued: 1,
		Tokens: [][]int32{{1, 2, 3}, {4, 9}, {6}}})
	var c comparison
	c.oomShared = 1
	for _, v := range []string{"tiny=90:100", "gqa=115:100"} {
		if err := c.plans.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.starts.Set("tiny=killed"); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := c.print(&out, shared, static); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"request 1 (gqa): first differs at token 1 of 2",
		"stock tiny, started with the shared run's sequences preallocated: killed",
		"plan tiny: 90 bytes planned, 100 measured (the resident set's peak growth): -10.0 % (-0.0 MiB: within max(2 %, 16 MiB))",
		"many-engines: engines=2 requests=3 served=3 oom-kills=1 drift=4096 tokens-identical=2/3 peak-seqs=6 static-peak-seqs=2 plan-error=+15.0%\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	c.plans = nil
	if err := c.plans.Set(fmt.Sprintf("ort=%d:%d", 100<<20, 120<<20)); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := c.print(&out, shared, static); err != nil || !strings.Contains(out.String(), "-16.7 % (-20.0 MiB: beyond max(2 %, 16 MiB))") {
		t.Errorf("a plan 20 MiB under: %v\n%s", err, out.String())
	}
	c.plans = nil
	out.Reset()
	if err := c.print(&out, shared, static); err != nil || !strings.Contains(out.String(), "plan-error=none\n") {
		t.Errorf("without plans: %v\n%s", err, out.String())
	}
}

// TestCompareFlagsRefuseBadInput: malformed -plan and -stock-start values
// are refused, a zero measure too (no error could be computed against it).
func TestCompareFlagsRefuseBadInput(t *testing.T) {
	var p planFlags
	for _, v := range []string{"", "tiny", "tiny=1", "tiny=a:2", "tiny=1:0", "=1:2"} {
		if err := p.Set(v); err == nil {
			t.Errorf("-plan %q accepted", v)
		}
	}
	var s startFlags
	for _, v := range []string{"tiny", "tiny=maybe", "=served"} {
		if err := s.Set(v); err == nil {
			t.Errorf("-stock-start %q accepted", v)
		}
	}
}

// TestDivergenceExplained: a differing request is explained by rounding
// only when the two runs' top two tokens are the same two, swapped, and
// the stock run's margin is within twice the largest move of the logits
// over the identical tokens before; otherwise it says why not.
func TestDivergenceExplained(t *testing.T) {
	memgen, stock := []int32{5, 6, 7}, []int32{5, 6, 8}
	prefix := func(move float64) ([]top2, []top2) {
		return []top2{{10, 1, 9}, {11, 2, 8}}, []top2{{10 + move, 1, 9}, {11 - move, 2, 8}}
	}
	for _, c := range []struct {
		name      string
		move      float64
		atM, atS  top2
		explained bool
		says      string
		noLogits  bool
	}{
		{name: "near-tie", move: 0.01, atM: top2{12.005, 8, 12}, atS: top2{12.01, 7, 12}, explained: true, says: "a near tie: stock chose 8 over 7 by 0.01, memgen 7 over 8 by 0.005"},
		{name: "wide-margin", move: 0.001, atM: top2{12.5, 8, 12}, atS: top2{12.5, 7, 12}, says: "not explained: the margin is more than twice"},
		{name: "not-swapped", move: 0.01, atM: top2{12.005, 9, 12}, atS: top2{12.01, 7, 12}, says: "not the same two candidates swapped"},
		{name: "no-logits", noLogits: true, says: "no logits to compare"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ta, tb := prefix(c.move)
			ta, tb = append(ta, c.atM), append(tb, c.atS)
			if c.noLogits {
				ta, tb = nil, nil
			}
			d := explain(3, "gqa", 2, memgen, stock, ta, tb)
			if d.explained() != c.explained || !strings.Contains(d.String(), c.says) || !strings.HasPrefix(d.String(), "request 3 (gqa): first differs at token 2 of 3") {
				t.Errorf("explained %v, want %v: %s", d.explained(), c.explained, d)
			}
		})
	}
}
