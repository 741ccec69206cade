package xproc

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// TestFit: the four answers of a ledger to an engine's need, each with its
// figures and a reason.
func TestFit(t *testing.T) {
	n := Need{Weights: 64 << 20, Start: 76 << 20, Full: 110 << 20, StartParts: "weights 64 MiB, compute 12 MiB"}
	for _, c := range []struct {
		h        Header
		verdict  FitVerdict
		giveBack memapi.Bytes
		reason   string
	}{
		{Header{Capacity: 1 << 30}, FitsNow, 0, "holds it at full context"},
		{Header{Capacity: 1 << 30, Charged: uint64(1<<30 - (n.Start + 5<<20))}, StartsNow, n.Full - (n.Start + 5<<20), "more from others"},
		{Header{Capacity: 100 << 20}, StartsNow, n.Full - 100<<20, "its full context exceeds the capacity"},
		{Header{Capacity: 1 << 30, Claimed: 1 << 30}, FitsAfterGiveBack, n.Start, "others must give back"},
		{Header{Capacity: uint64(n.Start) - 1}, NeverFits, 0, "weights 64 MiB, compute 12 MiB"},
		{Header{Capacity: uint64(n.Weights) - 1}, NeverFits, 0, "below the weights alone"},
	} {
		f := c.h.Fit(n)
		if f.Verdict != c.verdict || f.GiveBack != c.giveBack || !strings.Contains(f.Reason, c.reason) {
			t.Errorf("%+v: %+v, want %s giving back %d, saying %q", c.h, f, c.verdict, c.giveBack, c.reason)
		}
	}
}

// TestCheckFit: a missing ledger is Inspect's typed error; a need that
// never fits is a *FitError matching memapi.ErrOverBudget, and the ledger
// is left as it was.
func TestCheckFit(t *testing.T) {
	dir := t.TempDir()
	if _, err := CheckFit(dir+"/none", "m", Need{}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing ledger: %v", err)
	}
	path := dir + "/ledger"
	l, err := Open(path, Options{Create: &CreateOptions{Capacity: 64 << 20, Slots: 4}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = CheckFit(path, "big.onnx", Need{Weights: 128 << 20, Start: 130 << 20, Full: 200 << 20})
	var fe *FitError
	if !errors.As(err, &fe) || !errors.Is(err, memapi.ErrOverBudget) || fe.Model != "big.onnx" || !strings.Contains(err.Error(), "below the weights") {
		t.Fatalf("%v, want a *FitError for big.onnx", err)
	}
	if f, err := CheckFit(path, "small.onnx", Need{Weights: 8 << 20, Start: 9 << 20, Full: 16 << 20}); err != nil || f.Verdict != FitsNow {
		t.Fatalf("%+v, %v: want fits now", f, err)
	}
	h, _, err := Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Claimed != 0 || h.Charged != 0 {
		t.Errorf("the ledger changed: %+v", h)
	}
}
