package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// comparison is what -compare prints: the shared run against the static
// one, with what the caller counted outside the runs (the kernel's OOM
// kills, each engine's plan against its measured peak, stock engines
// started the way the shared run sizes its own).
type comparison struct {
	oomShared, oomStatic int
	plans                planFlags
	starts               startFlags
}

// planned is one engine's plan against what it really took.
type planned struct {
	name              string
	planned, measured uint64
}

// errorPct is the plan's error against the measure, in percent.
func (p planned) errorPct() float64 {
	return 100 * (float64(p.planned) - float64(p.measured)) / float64(p.measured)
}

// close says whether the plan is within max(2 %, 16 MiB) of the measure.
func (p planned) close() bool {
	d := max(p.planned, p.measured) - min(p.planned, p.measured)
	return d <= max(p.measured/50, 16<<20)
}

type planFlags []planned

func (f *planFlags) String() string { return fmt.Sprint(*f) }
func (f *planFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	a, b, ok2 := strings.Cut(rest, ":")
	p, err1 := strconv.ParseUint(a, 10, 64)
	m, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || !ok2 || name == "" || err1 != nil || err2 != nil || m == 0 {
		return fmt.Errorf("want NAME=PLANNED:MEASURED in bytes (MEASURED above 0), got %q", v)
	}
	*f = append(*f, planned{name, p, m})
	return nil
}

// started is one stock engine's start, sized as the shared run sizes its
// own: "served" (it started and served), "killed" (the kernel killed it)
// or "refused" (it failed to start).
type started struct{ name, outcome string }

type startFlags []started

func (f *startFlags) String() string { return fmt.Sprint(*f) }
func (f *startFlags) Set(v string) error {
	name, outcome, ok := strings.Cut(v, "=")
	if !ok || name == "" || (outcome != "served" && outcome != "killed" && outcome != "refused") {
		return fmt.Errorf("want NAME=served, NAME=killed or NAME=refused, got %q", v)
	}
	*f = append(*f, started{name, outcome})
	return nil
}

// print reads the two runs' JSON and prints the comparison, the summary
// line last.
func (c *comparison) print(w io.Writer, sharedPath, staticPath string) error {
	read := func(p string) (*Run, error) {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r Run
		return &r, json.Unmarshal(b, &r)
	}
	shared, err := read(sharedPath)
	if err != nil {
		return err
	}
	static, err := read(staticPath)
	if err != nil {
		return err
	}
	if shared.Requests != static.Requests {
		return errors.New("the runs replayed different requests")
	}
	identical, served := 0, 0
	var differ []divergence
	at := func(r *Run, i int) []top2 {
		if i < len(r.Top2) {
			return r.Top2[i]
		}
		return nil
	}
	for i := range shared.Tokens {
		a, b := shared.Tokens[i], static.Tokens[i]
		if a == nil {
			continue
		}
		served++
		first := firstDiff(a, b)
		if first < 0 {
			identical++
			continue
		}
		differ = append(differ, explain(i, shared.Engines[i%len(shared.Engines)].Name, first, a, b, at(shared, i), at(static, i)))
	}
	var drift uint64
	for _, a := range shared.Audits {
		drift = max(drift, a.Drift)
	}
	fmt.Fprintln(w, "run | served | 429s retried (queued) | failed | OOM kills | peak sequences | mean while requests waited | wall")
	fmt.Fprintln(w, "--- | --- | --- | --- | --- | --- | --- | ---")
	for _, r := range []struct {
		name string
		run  *Run
		oom  int
	}{{"shared ledger", shared, c.oomShared}, {"static shares", static, c.oomStatic}} {
		fmt.Fprintf(w, "%s | %d/%d | %d | %d | %d | %d (%s) | %.1f | %.1f s\n", r.name, r.run.Served, r.run.Requests, r.run.Retries,
			len(r.run.Errors), r.oom, r.run.Peak, peaks(r.run), r.run.MeanQueued, r.run.Wall)
	}
	if static.Peak > 0 {
		waited := "no request waited in the shared run"
		if shared.MeanQueued > 0 && static.MeanQueued > 0 {
			waited = fmt.Sprintf("mean while requests waited %.2fx", shared.MeanQueued/static.MeanQueued)
		}
		fmt.Fprintf(w, "shared / static: peak %.2fx, %s, wall time %.2fx\n",
			float64(shared.Peak)/float64(static.Peak), waited, shared.Wall/static.Wall)
	}
	for _, r := range []struct {
		name string
		run  *Run
	}{{"shared ledger", shared}, {"static shares", static}} {
		for _, e := range r.run.Engines {
			if n := r.run.PreemptedBy[e.Name]; n > 0 {
				fmt.Fprintf(w, "%s: %s preempted its sequences %d times (recomputed after: llama.cpp's prefill path, which rounds differently)\n", r.name, e.Name, n)
			}
		}
	}
	for _, s := range c.starts {
		fmt.Fprintf(w, "stock %s, started with the shared run's sequences preallocated: %s\n", s.name, s.outcome)
	}
	planErr := math.NaN()
	for _, p := range c.plans {
		within := "within"
		if !p.close() {
			within = "beyond"
		}
		fmt.Fprintf(w, "plan %s: %d bytes planned, %d measured (the resident set's peak growth): %+.1f %% (%+.1f MiB: %s max(2 %%, 16 MiB))\n",
			p.name, p.planned, p.measured, p.errorPct(), (float64(p.planned)-float64(p.measured))/(1<<20), within)
		if math.IsNaN(planErr) || math.Abs(p.errorPct()) > math.Abs(planErr) {
			planErr = p.errorPct()
		}
	}
	explained := 0
	for _, d := range differ {
		fmt.Fprintln(w, d)
		if d.explained() {
			explained++
		}
	}
	if len(differ) > 0 {
		fmt.Fprintf(w, "requests that differ: %d of %d (%.1f %%), %d explained by rounding\n", len(differ), served, 100*float64(len(differ))/float64(served), explained)
	}
	pe := "none"
	if !math.IsNaN(planErr) {
		pe = fmt.Sprintf("%+.1f%%", planErr)
	}
	fmt.Fprintf(w, "many-engines: engines=%d requests=%d served=%d oom-kills=%d drift=%d tokens-identical=%d/%d peak-seqs=%d static-peak-seqs=%d plan-error=%s\n",
		len(shared.Engines), shared.Requests, shared.Served, c.oomShared, drift, identical, served, shared.Peak, static.Peak, pe)
	return nil
}

func firstDiff(a, b []int32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
