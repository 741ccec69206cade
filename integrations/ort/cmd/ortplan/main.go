// Command ortplan answers, before any byte is committed and without
// loading ONNX Runtime, how much memory a decoder model (ort.NewDecoder's
// layout) and its sequences take, and whether they fit a shared ledger:
// it reads the model's graph (the initializers' shapes and types, the
// cache inputs, the nodes; not the weights' bytes) and prints the weights,
// the KV cache per token and at full context, the compute the workspace
// takes, the model's protobuf while it loads, and the totals at start, at
// full context and at the peak.
//
//	ortplan -model DECODER.onnx [-nctx 1024] [-sequences 16] [-preallocate] [-ledger PATH] [-json]
//
// With -ledger it reads the shared ledger (as memctl show does) and says
// whether the engine fits now, starts now and needs more for its full
// context, fits after other processes give back bytes, or never fits, with
// the figures.
//
// Exit codes, as memgen's, memctl's and llamaplan's: 0 planned (and, with
// -ledger, it fits now or starts now), 1 a model or ledger error, 2 a
// usage error, 3 with -ledger: it does not fit now (others must give back
// bytes first, or it never fits).
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
	"github.com/memgen/memgen/integrations/ort"
	"github.com/memgen/memgen/memreport"
)

// Exit codes, the same as memgen's, memctl's and llamaplan's.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitRefused = 3
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// output is what -json prints.
type output struct {
	Plan    *ort.DecoderPlan `json:"plan"`
	AtStart uint64           `json:"at_start"`
	AtFull  uint64           `json:"at_full"`
	Peak    uint64           `json:"peak"`
	Fit     *xproc.Fit       `json:"fit,omitempty"`
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ortplan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	model := fs.String("model", os.Getenv("MEMGEN_ORT_DECODER_MODEL"), "a decoder in ort.NewDecoder's layout")
	nCtx := fs.Int("nctx", 1024, "the most tokens of one sequence (MaxSeq)")
	seqs := fs.Int("sequences", 16, "sequences holding their KV cache at once")
	prealloc := fs.Bool("preallocate", false, "GenAI's layout: each sequence's KV allocated for -nctx at its start")
	ledger := fs.String("ledger", "", "a shared ledger file (memctl create): say whether the engine fits it")
	asJSON := fs.Bool("json", false, "print the plan as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: ortplan -model DECODER.onnx [-nctx N] [-sequences N] [-preallocate]
               [-ledger PATH] [-json]

Sizes a decoder model and its sequences before any byte is committed, from
the model's graph alone (ONNX Runtime is not loaded, the weights' bytes are
not read): the weights, the KV cache (per token and at full context), the
compute, the model's protobuf while it loads, and the totals. With -ledger:
whether the engine fits the shared ledger now.

flags:
`)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), `
example:
  ortplan -model decoder.onnx -nctx 1024 -sequences 24 -ledger /dev/shm/memgen

Exit codes (the same for memgen, memctl and llamaplan): 0 planned (with
-ledger: it fits now or starts now); 1 a model or ledger error; 2 a usage
error; 3 with -ledger: it does not fit now, or never fits.
`)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 || *model == "" {
		fmt.Fprintln(stderr, "ortplan: -model (or MEMGEN_ORT_DECODER_MODEL) is required, and nothing else")
		return exitUsage
	}
	mode := ort.KVGrow
	if *prealloc {
		mode = ort.KVPreallocated
	}
	p, err := ort.PlanDecoder(*model, ort.PlanOptions{NCtx: *nCtx, Sequences: *seqs, Mode: mode})
	if err != nil {
		fmt.Fprintln(stderr, "ortplan:", err)
		return exitFailed
	}
	out := output{Plan: p, AtStart: uint64(p.AtStart()), AtFull: uint64(p.AtFull()), Peak: uint64(p.Peak())}
	code := exitOK
	if *ledger != "" {
		h, _, err := xproc.Inspect(*ledger)
		if err != nil {
			fmt.Fprintln(stderr, "ortplan:", err)
			return exitFailed
		}
		f := h.Fit(p.Need())
		out.Fit = &f
		if f.Verdict != xproc.FitsNow && f.Verdict != xproc.StartsNow {
			code = exitRefused
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintln(stderr, "ortplan:", err)
			return exitFailed
		}
		return code
	}
	printPlan(stdout, out)
	return code
}

func printPlan(w io.Writer, o output) {
	p, b := o.Plan, memreport.FormatBytes
	fmt.Fprintf(w, "%s: %d sequences of %d tokens, KV %s (planned in %s)\n", p.Model, p.Sequences, p.NCtx, p.Mode, memreport.FormatDuration(p.Took))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "weights\t%s (%d initializers)\n", b(p.Weights), p.Initializers)
	fmt.Fprintf(tw, "KV cache\t%s per token (%d tensors), %s a sequence, %s at full context\n", b(p.KVPerToken), p.KVTensors, b(p.KVPerSequence), b(p.KVFull))
	fmt.Fprintf(tw, "compute\t%s (activations at most %s, in whole pool segments)\n", b(p.Compute), b(p.Activations))
	fmt.Fprintf(tw, "while loading\t%s (the model's protobuf)\n", b(p.Load))
	fmt.Fprintf(tw, "bookkeeping\tnot sized (ONNX Runtime's graph and kernels, in its heap)\n")
	fmt.Fprintf(tw, "totals\t%s at start, %s at full context, %s at the peak\n", b(p.AtStart()), b(p.AtFull()), b(p.Peak()))
	tw.Flush()
	if f := o.Fit; f != nil {
		fmt.Fprintf(w, "ledger: %s: %s\n", f.Verdict, f.Reason)
	}
}
