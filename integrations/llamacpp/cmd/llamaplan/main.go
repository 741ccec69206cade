// Command llamaplan answers, before any byte is committed, how much memory
// a llama GGUF model and one context of it take, and whether they fit a
// shared ledger: llama.cpp sizes every buffer for the exact configuration
// with its allocations simulated (the GGUF's metadata is read, not its
// weights), and llamaplan prints the weights, the KV cache per token and at
// full context, the compute and output buffers and the bookkeeping, and the
// totals at start and at full context, for memgen's engine (KV committed as
// tokens arrive) and for stock llama.cpp (KV allocated at creation).
//
//	llamaplan -model GGUF [-nctx 2048] [-sequences 1] [-batch 512] [-ubatch N] [-ledger PATH] [-json]
//
// With -ledger it reads the shared ledger (as memctl show does) and says
// whether the engine fits now, starts now and needs more for its full
// context, fits after other processes give back bytes, or never fits, with
// the figures.
//
// Exit codes, as memgen's, memctl's and memdemo's: 0 planned (and, with
// -ledger, it fits now or starts now), 1 a model, library or ledger error,
// 2 a usage error, 3 with -ledger: it does not fit now (others must give
// back bytes first, or it never fits).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/memgen/memgen/governor/xproc"
	"github.com/memgen/memgen/integrations/llamacpp"
	"github.com/memgen/memgen/memreport"
)

// Exit codes, the same as memgen's, memctl's and memdemo's.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitRefused = 3
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// output is what -json prints.
type output struct {
	Plan         *llamacpp.Plan `json:"plan"`
	AtStart      uint64         `json:"at_start"`
	AtFull       uint64         `json:"at_full"`
	StockAtStart uint64         `json:"stock_at_start"`
	Fit          *xproc.Fit     `json:"fit,omitempty"`
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("llamaplan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lib := fs.String("lib", os.Getenv("MEMGEN_LLAMACPP_LIB"), "libllama (scripts/llamacpp.sh prints it)")
	model := fs.String("model", os.Getenv("MEMGEN_LLAMACPP_MODEL"), "a llama GGUF model")
	nCtx := fs.Int("nctx", 2048, "tokens of one sequence (n_ctx per sequence)")
	seqs := fs.Int("sequences", 1, "sequences decoded together, each with n_ctx cells")
	batch := fs.Int("batch", 512, "n_batch: the most tokens one llama_decode takes")
	ubatch := fs.Int("ubatch", 0, "n_ubatch: the most tokens computed at once (default: -batch)")
	ledger := fs.String("ledger", "", "a shared ledger file (memctl create): say whether the engine fits it")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: llamaplan -model GGUF [-nctx N] [-sequences N] [-batch N] [-ubatch N] [-ledger PATH] [-json]

Sizes a model and one context of it before any byte is committed: llama.cpp
sizes every buffer for the configuration with its allocations simulated, and
the weights, the KV cache (per token and at full context), the compute and
output buffers, the bookkeeping and the totals are printed. With -ledger:
whether the engine fits the shared ledger now.

flags:
`)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), `
example:
  llamaplan -model gqa.gguf -nctx 4096 -sequences 8 -ledger /dev/shm/memgen

Exit codes (the same for memgen, memctl and memdemo): 0 planned (with
-ledger: it fits now or starts now); 1 a model, library or ledger error; 2 a
usage error; 3 with -ledger: it does not fit now, or never fits.
`)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 || *model == "" || *lib == "" {
		fmt.Fprintln(stderr, "llamaplan: -model and -lib (or MEMGEN_LLAMACPP_MODEL and MEMGEN_LLAMACPP_LIB) are required, and nothing else")
		return exitUsage
	}
	if err := llamacpp.Init(*lib); err != nil {
		fmt.Fprintln(stderr, "llamaplan:", err)
		return exitFailed
	}
	p, err := llamacpp.PlanContext(*model, llamacpp.PlanOptions{NCtx: *nCtx, Sequences: *seqs, Batch: *batch, UBatch: *ubatch})
	if err != nil {
		fmt.Fprintln(stderr, "llamaplan:", err)
		return exitFailed
	}
	out := output{Plan: p, AtStart: uint64(p.AtStart()), AtFull: uint64(p.AtFull()), StockAtStart: uint64(p.StockAtStart())}
	code := exitOK
	if *ledger != "" {
		h, _, err := xproc.Inspect(*ledger)
		if err != nil {
			fmt.Fprintln(stderr, "llamaplan:", err)
			return exitFailed
		}
		f := p.FitLedger(h)
		out.Fit = &f
		if f.Verdict != xproc.FitsNow && f.Verdict != xproc.StartsNow {
			code = exitRefused
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(stderr, "llamaplan:", err)
			return exitFailed
		}
		return code
	}
	printPlan(stdout, out)
	return code
}

func printPlan(w io.Writer, o output) {
	p, b := o.Plan, memreport.FormatBytes
	fmt.Fprintf(w, "%s: n_ctx %d x %d sequences, batch %d, ubatch %d (planned in %s)\n", p.Model, p.NCtx, p.Sequences, p.Batch, p.UBatch, memreport.FormatDuration(p.Took))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "weights\t%s\n", b(p.Weights))
	fmt.Fprintf(tw, "KV cache\t%s per token, %s at full context\n", b(p.KVPerToken), b(p.KVFull))
	fmt.Fprintf(tw, "compute buffers\t%s\n", b(p.Compute))
	fmt.Fprintf(tw, "output buffer\t%s\n", b(p.Output))
	fmt.Fprintf(tw, "bookkeeping (estimated)\t%s at start, %s at full context\n", b(p.Metadata), b(p.MetadataFull))
	fmt.Fprintf(tw, "memgen's engine\t%s at start, %s at full context (the KV cache committed as tokens arrive)\n", b(p.AtStart()), b(p.AtFull()))
	fmt.Fprintf(tw, "stock llama.cpp\t%s at start (the KV cache allocated at creation)\n", b(p.StockAtStart()))
	for _, x := range p.Buffers {
		fmt.Fprintf(tw, "  buffer type %s\tmodel %s, context %s, compute %s\n", x.Type, b(x.Model), b(x.Context), b(x.Compute))
	}
	tw.Flush()
	if f := o.Fit; f != nil {
		fmt.Fprintf(w, "ledger: %s: %s\n", f.Verdict, f.Reason)
	}
}
