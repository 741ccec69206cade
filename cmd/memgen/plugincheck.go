package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

func init() {
	commands["plugin-check"] = command{
		args:    " PATH.so",
		example: "memgen plugin-check -call-timeout 30s ./libmine.so",
		help: "Loads the C plugin at PATH.so, a path to the shared library (a name without\n" +
			"a slash is taken in the working directory), without the spec, and runs the\n" +
			"conformance suite on fresh instances of it, in three passes: the whole\n" +
			"suite bare and through the checked wrapper, with the loader in verify mode,\n" +
			"then the concurrency subtests with verification off (where nothing\n" +
			"serializes the plugin's calls). The spec/... subtests\n" +
			"check it against its own descriptor (name, device, offers, granularity), and\n" +
			"a host-memory plugin gets the leak check.\n\n" +
			"The plugin runs in a child process (this binary again), with every buffer it\n" +
			"writes guarded by an inaccessible page and every call bounded by\n" +
			"-call-timeout: a plugin that crashes or does not return is a finding (the\n" +
			"subtest, and the signal or the call and its bound), and the pass goes on\n" +
			"without that subtest, up to three findings a pass. Prints the plugin, the\n" +
			"suite's progress, each pass's counts and every failure with its log; exits 1\n" +
			"when the plugin does not load, crashes, hangs or fails a subtest. The command\n" +
			"a plugin author puts in their CI.",
		flags: func(fs *flag.FlagSet, o *options) {
			fs.StringVar(&o.config, "config", "", "the configuration string passed to the plugin's open (key=value,...)")
			fs.BoolVar(&o.verbose, "v", false, "also list every subtest as it ends, and the ones that were skipped")
			fs.DurationVar(&o.callBound, "call-timeout", 10*time.Second, "the bound of every call into the plugin: a call still running after it is\nreported as a hang; consuming slots get deadline_ns a fifth before it")
		},
		run:        runPluginCheck,
		positional: true,
	}
}

// maxFindings is how many crashes and hangs a pass reports before it stops.
const maxFindings = 3

// stderrKept is how much of a child's standard error is kept: the runtime
// writes the signal and the faulting goroutine first.
const stderrKept = 64 << 10

func runPluginCheck(o *options, stdout, stderr io.Writer) int {
	if len(o.args) != 1 {
		fmt.Fprintf(stderr, "memgen plugin-check: want one PATH.so, got %q\n", o.args)
		return exitUsage
	}
	if o.callBound <= 0 {
		fmt.Fprintf(stderr, "memgen plugin-check: -call-timeout must be positive, got %v\n", o.callBound)
		return exitUsage
	}
	path := o.args[0]
	if !strings.Contains(path, "/") {
		path = "./" + path // a file in this directory, not a soname on the search path
	}
	if name := os.Getenv(childEnv); name != "" {
		return runPluginCheckChild(o, path, name, stdout)
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "memgen plugin-check: cannot run the check process:", err)
		return exitSpec
	}
	s := &supervisor{o: o, path: path, exe: exe, stdout: stdout}
	var findings, failed int
	for i, p := range passes {
		r := s.runPass(p, i == 0)
		if r.refused != "" {
			fmt.Fprintln(stderr, "memgen plugin-check:", r.refused)
			return exitSpec
		}
		findings += len(r.findings)
		failed += r.failed
	}
	if findings > 0 || failed > 0 {
		fmt.Fprintf(stdout, "memgen plugin-check: FAIL (%d crashes or hangs, %d failed subtests)\n", findings, failed)
		return exitSpec
	}
	fmt.Fprintln(stdout, "memgen plugin-check: ok")
	return exitOK
}

// supervisor runs the passes in child processes and reports what they say.
type supervisor struct {
	o      *options
	path   string
	exe    string
	stdout io.Writer
	shown  bool // the plugin's line was printed
}

// finding is a subtest that crashed the child or had a call that did not
// return.
type finding struct {
	test string
	line string // what plugin-check prints about it, without the prefix
}

// passResult is what one pass found.
type passResult struct {
	refused  string // the plugin did not load: why
	findings []finding
	failed   int
}

// runPass runs pass p, restarting the child without a subtest that crashed
// or hung it, up to maxFindings times.
func (s *supervisor) runPass(p pass, first bool) passResult {
	var r passResult
	var skip []string
	for {
		c := s.runChild(p, skip)
		if c.refused != "" {
			return passResult{refused: c.refused}
		}
		if c.finding == nil {
			s.summarize(p, c.done, r.findings, &r)
			return r
		}
		r.findings = append(r.findings, *c.finding)
		kind := "CRASH"
		if c.stuck {
			kind = "HANG"
		}
		test := c.finding.test
		if test == "" {
			test = "(outside any subtest)"
		}
		fmt.Fprintf(s.stdout, "--- %s: %s/%s: %s\n", kind, p.name, test, c.finding.line)
		if c.finding.test == "" || len(r.findings) >= maxFindings {
			fmt.Fprintf(s.stdout, "%s: stopped after %d crashes or hangs; the rest of the pass did not run\n", p.name, len(r.findings))
			return r
		}
		skip = append(skip, c.finding.test)
		fmt.Fprintf(s.stdout, "%s: running the rest without %s\n", p.name, c.finding.test)
	}
}

// summarize prints a finished pass's counts and failures. The subtests that
// crashed or hung an earlier child were skipped in the last one: they count
// as failed.
func (s *supervisor) summarize(p pass, done *event, findings []finding, r *passResult) {
	skipped := 0
	for _, n := range done.SkippedNames {
		if !slices.ContainsFunc(findings, func(f finding) bool { return f.test == n }) {
			skipped++
		}
	}
	failed := len(done.Failures) + len(findings)
	r.failed = len(done.Failures)
	fmt.Fprintf(s.stdout, "%s: %d subtests, %d passed, %d failed, %d skipped\n", p.name, done.Leaves, done.Leaves-failed-skipped, failed, skipped)
	io.WriteString(s.stdout, done.Report)
	if s.o.verbose {
		for _, n := range done.SkippedNames {
			fmt.Fprintf(s.stdout, "--- SKIP: %s\n", n)
		}
	}
}

// childResult is how one child process ended.
type childResult struct {
	refused string
	done    *event
	finding *finding
	stuck   bool
}

// runChild runs one child for pass p without the subtests in skip and
// follows its events until it exits.
func (s *supervisor) runChild(p pass, skip []string) childResult {
	args := []string{"plugin-check", "-config", s.o.config, "-call-timeout", s.o.callBound.String(), s.path}
	cmd := exec.Command(s.exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+p.name, skipEnv+"="+strings.Join(skip, "\n"), "GOTRACEBACK=single")
	errb := &prefixBuffer{max: stderrKept}
	cmd.Stderr = errb
	pipe, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		return childResult{refused: fmt.Sprintf("cannot run the check process %s: %v", s.exe, err)}
	}
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 64<<20)
		for sc.Scan() {
			lines <- bytes.Clone(sc.Bytes())
		}
	}()
	// The child says it is alive every second; one that says nothing for
	// this long is stopped (a plugin can stop its whole process).
	silence := 2*s.o.callBound + 30*time.Second
	timer := time.NewTimer(silence)
	defer timer.Stop()
	var r childResult
	var open []string // the subtests started and not ended, outermost first
	var silent, badLine string
	for lines != nil {
		select {
		case b, ok := <-lines:
			if !ok {
				lines = nil
				break
			}
			timer.Reset(silence)
			var ev event
			if err := json.Unmarshal(b, &ev); err != nil {
				if badLine == "" {
					badLine = string(b) // the plugin wrote to standard output
				}
				continue
			}
			s.follow(p, ev, &open, &r)
		case <-timer.C:
			silent = fmt.Sprintf("the check process said nothing for %v: stopped", silence)
			_ = cmd.Process.Kill()
		}
	}
	werr := cmd.Wait()
	if r.refused != "" || r.stuck || r.done != nil && werr == nil {
		return r
	}
	test := ""
	if len(open) > 0 {
		test = open[len(open)-1]
	}
	line := silent
	if line == "" {
		line = "the plugin ended the check process: " + crashCause(werr, errb.Bytes())
	}
	if badLine != "" {
		line += fmt.Sprintf(" (it also wrote %q to standard output)", truncate(badLine, 80))
	}
	r.done, r.finding = nil, &finding{test: test, line: line}
	return r
}

// follow handles one event of a child.
func (s *supervisor) follow(p pass, ev event, open *[]string, r *childResult) {
	switch ev.Ev {
	case "plugin":
		if !s.shown {
			s.shown = true
			fmt.Fprintln(s.stdout, ev.Line)
		}
	case "refused":
		r.refused = ev.Line
	case "start":
		*open = append(*open, ev.Test)
		if !strings.Contains(ev.Test, "/") && (p.only == "" || strings.HasPrefix(p.only, ev.Test+"/")) {
			fmt.Fprintf(s.stdout, "%s: %s\n", p.name, ev.Test) // progress: each group of subtests
		}
	case "end":
		if i := slices.Index(*open, ev.Test); i >= 0 {
			*open = (*open)[:i]
		}
		if s.o.verbose && ev.Leaf && !ev.Skipped {
			status := "PASS"
			if ev.Failed {
				status = "FAIL"
			}
			fmt.Fprintf(s.stdout, "--- %s: %s/%s\n", status, p.name, ev.Test)
		}
	case "stuck":
		r.stuck = true
		r.finding = &finding{test: ev.Test, line: fmt.Sprintf("slot %s did not return within %v (-call-timeout): the check process was ended", ev.Slot, ev.Bound)}
	case "done":
		d := ev
		r.done = &d
	}
}

var (
	// The runtime's report of a signal: "SIGSEGV: segmentation violation"
	// for one in C code, "[signal SIGSEGV: ...]" after a panic.
	signalLine = regexp.MustCompile(`(?m)^\[?(?:signal )?(SIG[A-Z0-9]+): ([^\n\]]*)`)
	fatalLine  = regexp.MustCompile(`(?m)^(?:fatal error|panic): ([^\n]*)`)
	// The first call of the loader's API on the faulting goroutine's stack.
	loaderCall = regexp.MustCompile(`mechanisms/plugin\.\(\*(\w+)\)\.([A-Z]\w*)`)
)

// crashCause describes how a child died from its exit and what the runtime
// wrote: the signal, or the fatal error, and the loader call it was in.
func crashCause(werr error, stderr []byte) string {
	var what string
	if m := signalLine.FindSubmatch(stderr); m != nil {
		what = fmt.Sprintf("%s (%s)", m[1], m[2])
	} else if m := fatalLine.FindSubmatch(stderr); m != nil {
		what = "a fatal error: " + string(m[1])
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			if what == "" {
				what = "signal " + ws.Signal().String()
			}
		} else if what == "" {
			what = fmt.Sprintf("exit status %d", ee.ExitCode())
		}
	}
	if what == "" {
		what = "it exited before the pass ended"
		if werr != nil {
			what = werr.Error()
		}
	}
	if m := loaderCall.FindSubmatch(stderr); m != nil {
		what += fmt.Sprintf(" during %s.%s", m[1], m[2])
	}
	return what
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// prefixBuffer keeps the first max bytes written to it.
type prefixBuffer struct {
	buf bytes.Buffer
	max int
}

func (b *prefixBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *prefixBuffer) Bytes() []byte { return b.buf.Bytes() }
