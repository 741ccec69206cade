package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/holders"
	"github.com/memgen/memgen/internal/bytesize"
	"github.com/memgen/memgen/internal/clihelp"
)

// Config is everything a run depends on; flags fill it.
type Config struct {
	Trace    string // "" = the embedded excerpt
	Requests int    // replay only the first N requests (0: all)

	Mechanism   string       // "cpu" or "cuda"
	Authority   string       // the device's authority, as the report and the metrics name it ("": cpu:0, or the CUDA mechanism's cuda:N)
	Budget      memapi.Bytes // device capacity given to the governor
	HostBudget  memapi.Bytes // host capacity for offloaded weights (0: enough for both models)
	Granularity memapi.Bytes // CPU mechanism granularity: the unit KV grows in

	Shape        holders.ModelShape
	WeightBytes  memapi.Bytes  // the served model's weights (pinned)
	SecondBytes  memapi.Bytes  // the second model's weights (offloadable): the pressure source
	SecondEvery  time.Duration // simulated period between uses of the second model (0: loaded once, never used again)
	SecondHotFor time.Duration // the second model stays resident this long after a use
	PrefixTokens int           // shared system prompt: the first tokens of every prompt at least this long
	Watermark    memapi.Bytes  // room admission leaves free for growth (0: 1% of the budget)
	Workspace    bool          // each decode step's activations come from a caching pool (the activations holder)
	Vocab        int           // the served model's vocabulary: the step's logits are batch x Vocab fp32 (0: no logits)

	MaxContext  int // the served model's context length: what static-max reserves per request
	BlockTokens int // tokens per block of the paged baseline

	Step       StepModel
	Speedup    float64 // simulated seconds per wall second; 0: as fast as possible
	AuditEvery int     // steps between full audits (queue drained, kernel bytes read)

	MetricsAddr   string // serve Prometheus metrics here while running ("" = off)
	Report        string // write the HTML memory report here ("" = off)
	ReportJSON    string // write the JSON snapshot here ("" = beside the HTML report)
	ReportTrace   string // write the Chrome trace-event export here ("" = beside the HTML report)
	CompareStatic bool
	Progress      string // "auto", "bar", "line" or "off"
	CPUProfile    string // write a CPU profile of the run here ("" = off)
}

// StepModel is the simulated cost of one decode iteration: a fixed part, a
// part per running request, and the prefill of the tokens admitted or
// recomputed in that iteration. Both the memgen run and the static baseline
// are timed with it.
type StepModel struct {
	Base, PerSeq, PerPrefillToken time.Duration
}

// Duration returns the simulated time of an iteration running seqs
// requests and prefilling prefill tokens.
func (m StepModel) Duration(seqs, prefill int) time.Duration {
	return m.Base + time.Duration(seqs)*m.PerSeq + time.Duration(prefill)*m.PerPrefillToken
}

// DefaultConfig is what the flags default to: a scaled-down transformer
// (4 KiB of KV per token) under a 160 MiB budget, so the demo's real memory
// stays modest while the trace keeps the budget under pressure.
func DefaultConfig() Config {
	return Config{
		Mechanism:    "cpu",
		Budget:       160 << 20,
		Granularity:  128 << 10,
		Shape:        holders.ModelShape{Layers: 4, KVHeads: 4, HeadDim: 64, DTypeBytes: 2},
		WeightBytes:  64 << 20,
		SecondBytes:  32 << 20,
		SecondEvery:  30 * time.Second,
		SecondHotFor: 2 * time.Second,
		PrefixTokens: 768,
		Workspace:    true,
		Vocab:        4096,
		MaxContext:   16384,
		BlockTokens:  16,
		Step:         StepModel{Base: 20 * time.Millisecond, PerSeq: 150 * time.Microsecond, PerPrefillToken: 20 * time.Microsecond},
		AuditEvery:   500,
		Progress:     "auto",
	}
}

// bytesFlag is a flag.Value of a byte count with an optional binary unit:
// 512MiB, 1GiB, 64K, 4096.
type bytesFlag struct{ p *memapi.Bytes }

func (b bytesFlag) String() string {
	if b.p == nil {
		return "0"
	}
	return formatSize(*b.p)
}

func (b bytesFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

// parseSize reads a byte count the way every memgen command does
// (internal/bytesize): 4096, 64K, 512MiB, 1GiB, 1.5GB.
func parseSize(s string) (memapi.Bytes, error) {
	n, err := bytesize.Parse(s)
	return memapi.Bytes(n), err
}

// formatSize writes n with the largest binary unit that divides it, or in
// bytes with the unit B (0 is "0").
func formatSize(n memapi.Bytes) string { return bytesize.Format(uint64(n)) }

// ErrUsage marks a command-line error (exit status clihelp.ExitUsage).
var ErrUsage = errors.New("usage")

// usageError is a command-line error: its message is the problem alone
// (the caller adds where to find the flags), and it is an ErrUsage.
type usageError struct{ err error }

func (e usageError) Error() string        { return e.err.Error() }
func (e usageError) Unwrap() error        { return e.err }
func (e usageError) Is(target error) bool { return target == ErrUsage }

// parseFlags fills a Config from args. -h and --help return flag.ErrHelp
// after printing the usage to out; any other problem is a usageError that
// names the flag, and nothing is printed.
func parseFlags(args []string, out io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("memdemo", flag.ContinueOnError)
	// The flag package prints an error and the usage on every parse
	// error; the caller prints the error once instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	usage := func() {
		fs.SetOutput(out)
		fmt.Fprint(out, `memdemo replays LLM requests against a device memory budget through memgen:
model weights in a residency store, a KV page store growing one token per
decode step, a shared system prompt, pressure from a second model, all
accounted by the governor and checked against the mechanism and the kernel.

Usage: memdemo [flags]

Flags:
`)
		clihelp.Flags(out, fs)
		fmt.Fprint(out, "\n"+clihelp.ExitCodes+"memdemo: 1 is a failed check or a run that could not complete (--mechanism\ncuda without CUDA: the typed unavailable error); it never refuses (3).\n")
	}
	fs.StringVar(&c.Trace, "trace", c.Trace, "`CSV` trace in the Azure LLM trace format (default: the embedded excerpt, first 2,000 requests of the Azure LLM inference trace 2023)")
	fs.IntVar(&c.Requests, "requests", c.Requests, "replay only the first `N` requests (0: all)")
	fs.StringVar(&c.Mechanism, "mechanism", c.Mechanism, "device mechanism: cpu, or cuda where a GPU and its driver are present")
	fs.StringVar(&c.Authority, "authority", c.Authority, "`name` of the device's authority in the report and the metrics (default: cpu:0 on the CPU mechanism, cuda:N on a GPU; the offload target is host)")
	fs.Var(bytesFlag{&c.Budget}, "budget", "device memory `bytes` the governor may grant (e.g. 512MiB, 2GiB)")
	fs.Var(bytesFlag{&c.HostBudget}, "host-budget", "host memory `bytes` for offloaded weights (0: both models' weights)")
	fs.Var(bytesFlag{&c.Granularity}, "granularity", "CPU mechanism granularity, the `bytes` KV grows by (a power of two multiple of the page size)")
	fs.IntVar(&c.Shape.Layers, "layers", c.Shape.Layers, "model shape: transformer `layers`")
	fs.IntVar(&c.Shape.KVHeads, "kv-heads", c.Shape.KVHeads, "model shape: key/value `heads`")
	fs.IntVar(&c.Shape.HeadDim, "head-dim", c.Shape.HeadDim, "model shape: `dimensions` per head")
	fs.IntVar(&c.Shape.DTypeBytes, "dtype-bytes", c.Shape.DTypeBytes, "model shape: `bytes` per element (2 for fp16)")
	fs.Var(bytesFlag{&c.WeightBytes}, "weights", "weights of the served model in `bytes` (pinned)")
	fs.Var(bytesFlag{&c.SecondBytes}, "second-weights", "weights of the second model in `bytes` (offloaded under pressure; 0: no second model)")
	fs.DurationVar(&c.SecondEvery, "second-every", c.SecondEvery, "simulated `period` between uses of the second model (0: never used after loading)")
	fs.DurationVar(&c.SecondHotFor, "second-hot-for", c.SecondHotFor, "the second model stays resident this simulated `long` after a use")
	fs.IntVar(&c.PrefixTokens, "prefix-tokens", c.PrefixTokens, "shared system prompt `tokens`: prompts at least this long share them read-only (0: no sharing)")
	fs.Var(bytesFlag{&c.Watermark}, "watermark", "device `bytes` admission leaves free for running requests to grow into (0: 1% of the budget)")
	fs.BoolVar(&c.Workspace, "workspace", c.Workspace, "allocate each decode step's activations from a caching pool, a governed cache asked first under pressure (--workspace=false: none)")
	fs.IntVar(&c.Vocab, "vocab", c.Vocab, "the served model's vocabulary in `tokens`: each step's logits are batch x vocab fp32 in the workspace (0: none)")
	fs.DurationVar(&c.Step.Base, "step-base", c.Step.Base, "simulated decode iteration: fixed `time`")
	fs.DurationVar(&c.Step.PerSeq, "step-per-seq", c.Step.PerSeq, "simulated decode iteration: `time` per running request")
	fs.DurationVar(&c.Step.PerPrefillToken, "step-per-prefill-token", c.Step.PerPrefillToken, "simulated decode iteration: `time` per prompt token prefilled or recomputed")
	fs.IntVar(&c.MaxContext, "max-context", c.MaxContext, "the served model's context length in `tokens`: static-max reserves it for every request, static-pow2 at most it")
	fs.IntVar(&c.BlockTokens, "block-tokens", c.BlockTokens, "`tokens` per block of the paged baseline")
	fs.Float64Var(&c.Speedup, "speedup", c.Speedup, "simulated seconds per wall-clock `second` (0: as fast as the memory operations allow)")
	fs.IntVar(&c.AuditEvery, "audit-every", c.AuditEvery, "`steps` between full audits (deferred frees drained; governor, mechanism and kernel bytes compared)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "serve Prometheus metrics at `host:port` (a loopback address) while running")
	fs.StringVar(&c.Report, "report", c.Report, "write the HTML memory report to `file` (and its JSON snapshot beside it)")
	fs.StringVar(&c.ReportJSON, "report-json", c.ReportJSON, "write the JSON snapshot to `file` (default: the --report file with .json)")
	fs.StringVar(&c.ReportTrace, "report-trace", c.ReportTrace, "write the Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing) to `file` (default: the --report file with .trace.json)")
	fs.BoolVar(&c.CompareStatic, "compare", c.CompareStatic, "also replay the trace under the baselines (static-max, static-pow2, static-oracle, paged) and print the ratios")
	fs.BoolVar(&c.CompareStatic, "compare-static", c.CompareStatic, "the same as --compare")
	fs.StringVar(&c.Progress, "progress", c.Progress, "progress display: auto (a bar on a terminal, periodic lines otherwise), bar, line or off")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write a CPU profile of the run to `file`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return c, err
		}
		return c, usageError{err}
	}
	if fs.NArg() > 0 {
		return c, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	if err := c.validate(); err != nil {
		return c, usageError{err}
	}
	return c, nil
}

func (c *Config) validate() error {
	if err := c.Shape.Validate(); err != nil {
		return err
	}
	switch c.Mechanism {
	case "cpu", "cuda":
	default:
		return fmt.Errorf("--mechanism %q: want cpu or cuda", c.Mechanism)
	}
	if c.Authority == string(hostAuthority) {
		return fmt.Errorf("--authority %q: the host's authority (the offload target) has that name", c.Authority)
	}
	switch c.Progress {
	case "auto", "bar", "line", "off":
	default:
		return fmt.Errorf("--progress %q: want auto, bar, line or off", c.Progress)
	}
	if c.Budget == 0 {
		return errors.New("--budget 0: must be positive (a size such as 160MiB)")
	}
	if c.WeightBytes == 0 {
		return errors.New("--weights 0: must be positive (a size such as 64MiB)")
	}
	if c.WeightBytes+c.SecondBytes >= c.Budget {
		return fmt.Errorf("--budget %s: the weights (--weights %s + --second-weights %s) leave no room for KV (a size without a unit is in bytes)", formatSize(c.Budget), formatSize(c.WeightBytes), formatSize(c.SecondBytes))
	}
	for _, f := range []struct {
		name     string
		value    any
		negative bool
	}{
		{"--requests", c.Requests, c.Requests < 0},
		{"--prefix-tokens", c.PrefixTokens, c.PrefixTokens < 0},
		{"--vocab", c.Vocab, c.Vocab < 0},
		{"--speedup", c.Speedup, c.Speedup < 0},
		{"--audit-every", c.AuditEvery, c.AuditEvery < 0},
		{"--second-every", c.SecondEvery, c.SecondEvery < 0},
		{"--second-hot-for", c.SecondHotFor, c.SecondHotFor < 0},
		{"--step-per-seq", c.Step.PerSeq, c.Step.PerSeq < 0},
		{"--step-per-prefill-token", c.Step.PerPrefillToken, c.Step.PerPrefillToken < 0},
	} {
		if f.negative {
			return fmt.Errorf("%s %v: must not be negative", f.name, f.value)
		}
	}
	if c.MaxContext <= 0 {
		return fmt.Errorf("--max-context %d: must be positive (tokens)", c.MaxContext)
	}
	if c.BlockTokens <= 0 {
		return fmt.Errorf("--block-tokens %d: must be positive (tokens)", c.BlockTokens)
	}
	if c.Step.Base <= 0 {
		return fmt.Errorf("--step-base %v: must be positive", c.Step.Base)
	}
	if c.MetricsAddr != "" {
		host, _, err := net.SplitHostPort(c.MetricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr %q: %v", c.MetricsAddr, err)
		}
		if host != "localhost" {
			ip := net.ParseIP(host)
			if ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("--metrics-addr %q: serve metrics on a loopback address (localhost, 127.0.0.1, [::1])", c.MetricsAddr)
			}
		}
	}
	if c.Watermark == 0 {
		c.Watermark = c.Budget / 100
	}
	if c.HostBudget == 0 {
		c.HostBudget = c.WeightBytes + c.SecondBytes
	}
	if c.ReportJSON == "" && c.Report != "" {
		c.ReportJSON = strings.TrimSuffix(c.Report, ".html") + ".json"
	}
	if c.ReportTrace == "" && c.Report != "" {
		c.ReportTrace = strings.TrimSuffix(c.Report, ".html") + ".trace.json"
	}
	return nil
}

// kvRoom is the part of the device budget one request's KV can always
// get: the budget less both models' weights and the shared prefix (the
// second model may be hot, and so not offloadable, when the request grows).
func (c Config) kvRoom(prefix memapi.Bytes) memapi.Bytes {
	if c.WeightBytes+c.SecondBytes+prefix >= c.Budget {
		return 0
	}
	return c.Budget - c.WeightBytes - c.SecondBytes - prefix
}
