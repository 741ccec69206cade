package ort

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/ort-failures.txt from this run")

// The suites of ONNX conformance models the test runs, under testData.
var suites = []string{"node", "simple", "pytorch-operator"}

const failuresFile = "testdata/ort-failures.txt"

// errHarness marks a model the harness cannot feed or read (non-tensor
// values, sub-byte element types); it is recorded like a failure.
var errHarness = errors.New("harness")

func loadSet(t testing.TB, dir string, set int, kind string, n int) []tensor {
	t.Helper()
	ts, err := readSet(dir, set, kind, n)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func readSet(dir string, set int, kind string, n int) ([]tensor, error) {
	var out []tensor
	for i := range n {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("test_data_set_%d", set), fmt.Sprintf("%s_%d.pb", kind, i)))
		if err != nil {
			return nil, fmt.Errorf("%w: %v", errHarness, err)
		}
		t, err := parseTensorProto(b)
		if err != nil {
			return nil, fmt.Errorf("%w: %s_%d.pb: %v", errHarness, kind, i, err)
		}
		out = append(out, t)
	}
	return out, nil
}

// Tolerance of the ONNX backend test runner (numpy.testing.assert_allclose).
const rtol, atol = 1e-3, 1e-7

// compare reports whether got matches want: same element type and shape;
// floating-point elements within the ONNX tolerance (NaN matches NaN);
// everything else exactly.
func compare(got, want tensor) error {
	if got.Elem != want.Elem {
		return fmt.Errorf("element type %d, want %d", got.Elem, want.Elem)
	}
	if !slices.Equal(got.Shape, want.Shape) {
		return fmt.Errorf("shape %v, want %v", got.Shape, want.Shape)
	}
	if got.Elem == elemString {
		if !slices.Equal(got.Strings, want.Strings) {
			return fmt.Errorf("strings %q, want %q", got.Strings, want.Strings)
		}
		return nil
	}
	g, w, ok := floats(got), floats(want), true
	if !ok || g == nil {
		if !bytes.Equal(got.Data, want.Data) {
			return fmt.Errorf("data differs (%d bytes)", len(got.Data))
		}
		return nil
	}
	for i := range w {
		a, b := g[i], w[i]
		if math.IsNaN(a) && math.IsNaN(b) || a == b {
			continue
		}
		if math.Abs(a-b) > atol+rtol*math.Abs(b) {
			return fmt.Errorf("element %d is %g, want %g (rtol %g, atol %g)", i, a, b, rtol, atol)
		}
	}
	return nil
}

// floats decodes floating-point tensors (float, double, float16, bfloat16,
// complex64, complex128) to float64; nil for other types.
func floats(t tensor) []float64 {
	d := t.Data
	var out []float64
	switch t.Elem {
	case elemFloat, 14:
		for i := 0; i+4 <= len(d); i += 4 {
			out = append(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(d[i:]))))
		}
	case elemDouble, 15:
		for i := 0; i+8 <= len(d); i += 8 {
			out = append(out, math.Float64frombits(binary.LittleEndian.Uint64(d[i:])))
		}
	case elemFloat16:
		for i := 0; i+2 <= len(d); i += 2 {
			out = append(out, float64(half(binary.LittleEndian.Uint16(d[i:]))))
		}
	case elemBFloat16:
		for i := 0; i+2 <= len(d); i += 2 {
			out = append(out, float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(d[i:]))<<16)))
		}
	default:
		return nil
	}
	if out == nil {
		out = []float64{}
	}
	return out
}

// half converts an IEEE 754 binary16 to float32.
func half(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case exp == 0 && frac == 0:
		return math.Float32frombits(sign)
	case exp == 0:
		return float32(math.Ldexp(float64(frac), -24)) * float32(1-2*int(sign>>31))
	}
	return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
}

// runModel runs every test data set of the model in dir and returns the
// outputs of each set, or why it failed.
func runModel(dir string, useEnv bool) ([][]tensor, error) {
	s, err := newSession(filepath.Join(dir, "model.onnx"), useEnv, 1)
	if err != nil {
		return nil, err
	}
	defer s.close()
	for _, io := range append(slices.Clone(s.inputs), s.outputs...) {
		if io.onnxType != onnxTypeTensor {
			return nil, fmt.Errorf("%w: %s is of ONNX type %d, not a tensor", errHarness, io.name, io.onnxType)
		}
	}
	sets, _ := filepath.Glob(filepath.Join(dir, "test_data_set_*"))
	var all [][]tensor
	for i := range sets {
		in, err := readSet(dir, i, "input", len(s.inputs))
		if err != nil {
			return nil, err
		}
		want, err := readSet(dir, i, "output", len(s.outputs))
		if err != nil {
			return nil, err
		}
		relabel(in, s.inputs)
		relabel(want, s.outputs)
		got, err := s.run(in)
		if err != nil {
			return nil, fmt.Errorf("data set %d: %w", i, err)
		}
		for j := range want {
			if err := compare(got[j], want[j]); err != nil {
				return nil, fmt.Errorf("data set %d, output %s: %w", i, s.outputs[j].name, err)
			}
		}
		all = append(all, got)
	}
	return all, nil
}

// relabel gives bfloat16 tensors that the test data stores as uint16 (as
// ONNX's older test data does) the model's declared element type.
func relabel(ts []tensor, ios []ioInfo) {
	const uint16Elem = 4
	for i := range ts {
		if ts[i].Elem == uint16Elem && ios[i].elemType == elemBFloat16 {
			ts[i].Elem = elemBFloat16
		}
	}
}

// TestConformanceModels runs the ONNX project's conformance models through
// ONNX Runtime twice, with its default CPU allocator and with the memgen
// allocator: every model that passes with the default passes with memgen,
// with outputs within the ONNX tolerance of the default's; after each
// memgen session closes the holder's charge is zero and the kernel agrees.
// The models ONNX Runtime (or the harness) fails are recorded in
// testdata/ort-failures.txt; a change in that list fails the test (rerun
// with -update after checking it).
func TestConformanceModels(t *testing.T) {
	if testing.Short() {
		t.Skip("1,000 models; skipped with -short")
	}
	r := newRig(t, 4<<30, Options{})
	var failures []string
	var models, passed int
	for _, suite := range suites {
		dirs, err := filepath.Glob(filepath.Join(testData, suite, "*", "model.onnx"))
		if err != nil || len(dirs) == 0 {
			t.Fatalf("no models under %s: %v", filepath.Join(testData, suite), err)
		}
		for _, m := range dirs {
			dir := filepath.Dir(m)
			name := suite + "/" + filepath.Base(dir)
			models++
			def, derr := runModel(dir, false)
			before := r.alloc.Stats().Allocs
			if rec != nil {
				rec.mark(name)
			}
			mem, merr := runModel(dir, true)
			r.auditZero(t, name+" closed")
			if derr != nil {
				failures = append(failures, name+": "+oneLine(derr))
				continue
			}
			passed++
			if merr != nil {
				t.Errorf("%s passes with ONNX Runtime's allocator but fails with memgen's: %v", name, merr)
				continue
			}
			if r.alloc.Stats().Allocs == before && hasData(mem) {
				t.Errorf("%s: no allocation went through the memgen allocator", name)
			}
			for i := range def {
				for j := range def[i] {
					if err := compare(mem[i][j], def[i][j]); err != nil {
						t.Errorf("%s: data set %d output %d: memgen vs default: %v", name, i, j, err)
					}
				}
			}
		}
	}
	st := r.alloc.Stats()
	t.Logf("%d models, %d pass with both allocators, %d recorded as failing with ONNX Runtime's own; memgen allocator: %d allocs, %d frees, %d refused",
		models, passed, len(failures), st.Allocs, st.Frees, st.Refused)
	got := strings.Join(failures, "\n") + "\n"
	if *update {
		if err := os.WriteFile(failuresFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(failuresFile)
	if err != nil {
		t.Fatalf("%v (run with -update to record)", err)
	}
	// The reasons are for the reader (some models are random, so their
	// mismatching element varies); the list of models must not change.
	if d := lineDiff(modelNames(string(want)), modelNames(got)); d != "" {
		t.Errorf("models failing with ONNX Runtime's own allocator differ from %s (rerun with -update after review):\n%s", failuresFile, d)
	}
}

// modelNames keeps the model name of each line of a failures list.
func modelNames(list string) string {
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		name, _, _ := strings.Cut(l, ": ")
		names = append(names, name)
	}
	return strings.Join(names, "\n")
}

func oneLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

func lineDiff(a, b string) string {
	as, bs := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range as {
		if !slices.Contains(bs, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bs {
		if !slices.Contains(as, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// hasData reports whether any output holds an element (ONNX Runtime
// allocates nothing for empty outputs).
func hasData(sets [][]tensor) bool {
	for _, set := range sets {
		for _, t := range set {
			if t.count() > 0 {
				return true
			}
		}
	}
	return false
}
