package llamacpp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// childEnv names the environment variable that makes the test binary a
// child of TestOneRowShortFaults: "short" commits one row less than the
// decode needs, "exact" the rows it needs.
const childEnv = "MEMGEN_LLAMACPP_CHILD"

// runChild decodes a prompt of 8 tokens, then one more token with the KV
// regions committed to 8 rows when it needs 9 (short) or to 9 (exact). A
// row is 1 KiB and the granule 4 KiB, so 8 rows are exactly 2 granules:
// the 9th row is the first byte of an uncommitted (PROT_NONE) page.
// "prefill-untiled" instead decodes a prompt of 100 tokens with the rows
// committed to exactly 100 (not the 128 of two 64-row tiles); "batch63"
// decodes 10 tokens, then a batch of 63 with the rows committed to exactly
// 73, and "batch63-short" to 72; "batch64" decodes 10 tokens, then a
// batch of 64 (committed to its tile's end, 128 rows). "ubatch32" decodes
// a prompt of 97 tokens in ubatches of 32 with the rows committed to
// exactly 97 (no tile: no ubatch holds 64 tokens; 25 granules),
// "ubatch32-short" to 96 (24 granules: row 97 is not backed); "batch32"
// decodes it in four llama_decode calls of at most 32 tokens after one
// growth to its 97 rows.
func runChild() int {
	mode := os.Getenv(childEnv)
	if err := Init(libPath); err != nil {
		fmt.Println("child:", err)
		return 3
	}
	r, cleanup, err := newChildRig()
	if err != nil {
		fmt.Println("child:", err)
		return 3
	}
	defer cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := LoadModel(ctx, modelPath, r.options())
	if err != nil {
		fmt.Println("child:", err)
		return 3
	}
	if strings.HasPrefix(mode, "batch16") {
		return batchChild(ctx, m, mode == "batch16-short")
	}
	opts := ContextOptions{NCtx: 256}
	switch mode {
	case "ubatch32", "ubatch32-short":
		opts.UBatch = 32
	case "batch32":
		opts.Batch = 32
	}
	c, err := m.NewContext(ctx, opts)
	if err != nil {
		fmt.Println("child:", err)
		return 3
	}
	if n, ok := map[string]int{"batch63": 63, "batch63-short": 63, "batch64": 64}[mode]; ok {
		// 10 cells, then n tokens: 63 make 73 rows, one more than 18
		// granules, so one row short leaves the last row uncommitted.
		if _, err := c.Decode(ctx, prompt(1, 10, m.NVocab())); err != nil {
			fmt.Println("child:", err)
			return 3
		}
		if mode == "batch63-short" {
			rowsShort = 1
		}
		if _, err := c.Decode(ctx, prompt(2, n, m.NVocab())); err != nil {
			fmt.Println("child:", err)
			return 3
		}
		fmt.Printf("child: decoded a batch of %d tokens\n", n)
		return 0
	}
	if mode == "prefill-untiled" || mode == "prefill" || strings.HasPrefix(mode, "ubatch32") || mode == "batch32" {
		switch mode {
		case "prefill-untiled":
			untiled = true
		case "ubatch32-short":
			rowsShort = 1
		}
		// 100 tokens; 97 with ubatches (24 granules and a row: one row
		// short ends on a granule).
		n := 100
		if mode != "prefill" && mode != "prefill-untiled" {
			n = 97
		}
		if _, err := c.Decode(ctx, prompt(1, n, m.NVocab())); err != nil {
			fmt.Println("child:", err)
			return 3
		}
		fmt.Printf("child: decoded a prompt of %d tokens\n", n)
		return 0
	}
	if _, err := c.Decode(ctx, []int32{1, 2, 3, 4, 5, 6, 7, 8}); err != nil {
		fmt.Println("child:", err)
		return 3
	}
	if mode == "short" {
		rowsShort = 1
	}
	next, err := c.Decode(ctx, []int32{9})
	if err != nil {
		fmt.Println("child:", err)
		return 3
	}
	kv := c.KV()
	fmt.Printf("child: decoded the 9th token (next %d) with %d bytes committed in %d tensors\n", next, kv.Committed, kv.Tensors)
	return 0
}

// TestOneRowShortFaults: llama.cpp touches the rows the decode needs and
// they must be backed — committing one row short makes the engine fault
// (in a child process), while committing exactly the rows runs.
func TestOneRowShortFaults(t *testing.T) {
	run := func(mode string) (string, error) { return faultChild(t, mode) }
	out, err := run("exact")
	if err != nil || !strings.Contains(out, "child: decoded the 9th token") {
		t.Fatalf("exact commit: %v\n%s", err, out)
	}
	t.Logf("exact: %s", strings.TrimSpace(out))
	out, err = run("short")
	if err == nil {
		t.Fatalf("one row short: the child exited cleanly:\n%s", out)
	}
	if !strings.Contains(out, "SIGSEGV") {
		t.Fatalf("one row short: the child failed without a segmentation fault: %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(out, "\n")
	t.Logf("one row short: %v: %s", err, first)
}

// TestPrefillNeedsWholeTiles: a batch of 64 tokens or more is attended
// 64 KV rows at a time, so its rows are committed up to the tile's end
// (then given back): a prompt of 100 tokens and a batch of exactly 64
// decode; committed to exactly the batch's rows, the engine faults.
func TestPrefillNeedsWholeTiles(t *testing.T) {
	run := func(mode string) (string, error) { return faultChild(t, mode) }
	out, err := run("prefill")
	if err != nil || !strings.Contains(out, "child: decoded a prompt of 100 tokens") {
		t.Fatalf("tiled commit: %v\n%s", err, out)
	}
	out, err = run("batch64")
	if err != nil || !strings.Contains(out, "child: decoded a batch of 64 tokens") {
		t.Fatalf("a batch of exactly 64 tokens: %v\n%s", err, out)
	}
	out, err = run("prefill-untiled")
	if err == nil || !strings.Contains(out, "SIGSEGV") {
		t.Fatalf("untiled commit: want a segmentation fault, got %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(out, "\n")
	t.Logf("rows committed to the batch only: %v: %s", err, first)
}

// TestSmallBatchNeedsItsRowsOnly: a batch of fewer than 64 tokens (63
// after 10 cells) reads and writes exactly its rows, as a single token
// does: committed to them (73 rows, no tile rounding) it decodes, and one
// row short the engine faults, so the commit is neither short nor more
// than the rows.
func TestSmallBatchNeedsItsRowsOnly(t *testing.T) {
	run := func(mode string) (string, error) { return faultChild(t, mode) }
	out, err := run("batch63")
	if err != nil || !strings.Contains(out, "child: decoded a batch of 63 tokens") {
		t.Fatalf("exact commit: %v\n%s", err, out)
	}
	out, err = run("batch63-short")
	if err == nil || !strings.Contains(out, "SIGSEGV") {
		t.Fatalf("one row short: want a segmentation fault, got %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(out, "\n")
	t.Logf("one row short: %v: %s", err, first)
}

// TestSmallUBatchNeedsItsRowsOnly: with ubatches of fewer than 64 tokens
// (ContextOptions.UBatch 32) a prompt of 97 tokens is never attended a
// whole tile at a time: committed to exactly its 97 rows it decodes, one
// row short the engine faults. Decoded in batches of 32 (four llama_decode
// calls), one growth to the 97 rows before the first covers them all.
func TestSmallUBatchNeedsItsRowsOnly(t *testing.T) {
	run := func(mode string) (string, error) { return faultChild(t, mode) }
	for _, mode := range []string{"ubatch32", "batch32"} {
		out, err := run(mode)
		if err != nil || !strings.Contains(out, "child: decoded a prompt of 97 tokens") {
			t.Fatalf("%s, exact commit: %v\n%s", mode, err, out)
		}
	}
	out, err := run("ubatch32-short")
	if err == nil || !strings.Contains(out, "SIGSEGV") {
		t.Fatalf("one row short: want a segmentation fault, got %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(out, "\n")
	t.Logf("one row short: %v: %s", err, first)
}

// TestTouchedRows: the rows committed before a decode are its cells, plus
// the rest of the last 64-row tile only when a ubatch of 64 tokens or more
// is attended (the tiled kernel), at most the tensor's rows.
func TestTouchedRows(t *testing.T) {
	for _, c := range []struct{ cells, n, ubatch, rows, want int }{
		{0, 1, 512, 8192, 1},        // a single token
		{10, 63, 512, 8192, 73},     // a small batch: its rows only
		{10, 64, 512, 8192, 128},    // a tiled ubatch: to the tile's end
		{0, 100, 512, 8192, 128},    // a tiled prompt
		{0, 100, 32, 8192, 100},     // ubatches of 32: untiled, exact
		{0, 1008, 8, 8192, 1008},    // ubatches of 8: exact
		{0, 1008, 64, 8192, 1024},   // ubatches of 64: tiled
		{8100, 70, 512, 8192, 8192}, // the tile's end capped at the rows
	} {
		if got := touched(c.cells, c.n, c.ubatch, c.rows); got != c.want {
			t.Errorf("touched(cells %d, n %d, ubatch %d, rows %d) = %d, want %d", c.cells, c.n, c.ubatch, c.rows, got, c.want)
		}
	}
}

// faultChild runs the test binary as a child of mode (runChild) and
// returns its output.
func faultChild(t *testing.T, mode string) (string, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
