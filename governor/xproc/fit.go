package xproc

import (
	"fmt"

	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/bytesize"
)

// Need is what an engine needs of a shared ledger, as its plan sizes it
// before any byte is committed.
type Need struct {
	Weights memapi.Bytes // the model's weights, the floor of any start
	Start   memapi.Bytes // the engine at start, before a token (the weights included)
	Full    memapi.Bytes // the engine with every sequence at full context
	// StartParts says what Start is made of, for the answer's reason
	// ("weights 14 MiB, activations 36 KiB").
	StartParts string
}

// FitVerdict is how a Need fits a shared ledger.
type FitVerdict string

const (
	// FitsNow: the ledger's free bytes hold the engine at full context.
	FitsNow FitVerdict = "fits now"
	// StartsNow: the free bytes hold the engine at start (its KV cache
	// then grows into what others give back); its full context needs
	// GiveBack more.
	StartsNow FitVerdict = "starts now"
	// FitsAfterGiveBack: the engine needs GiveBack bytes that other
	// processes hold before it can start.
	FitsAfterGiveBack FitVerdict = "fits after others give back"
	// NeverFits: the ledger's capacity is below what the engine needs at
	// start.
	NeverFits FitVerdict = "never fits"
)

// Fit is a ledger's answer to a Need.
type Fit struct {
	Verdict  FitVerdict   `json:"verdict"`
	Capacity memapi.Bytes `json:"capacity"`
	// Free is the ledger's capacity less what its processes hold or have
	// claimed.
	Free memapi.Bytes `json:"free"`
	// GiveBack is what others must give back: for the engine to start
	// (FitsAfterGiveBack), or to reach its full context (StartsNow).
	GiveBack memapi.Bytes `json:"give_back"`
	Reason   string       `json:"reason"`
}

// Fit answers whether n fits the ledger whose header h is (read with
// Inspect): its start and its full context against the free bytes and
// the capacity.
func (h Header) Fit(n Need) Fit {
	b := func(n memapi.Bytes) string { return bytesize.Human(uint64(n)) }
	capacity := memapi.Bytes(h.Capacity)
	used := memapi.Bytes(max(h.Claimed, h.Reserved+h.Charged+h.Pending+h.Private))
	f := Fit{Capacity: capacity, Free: capacity - min(used, capacity)}
	switch {
	case n.Weights > capacity:
		f.Verdict = NeverFits
		f.Reason = fmt.Sprintf("the ledger's capacity of %s is below the weights alone (%s)", b(capacity), b(n.Weights))
	case n.Start > capacity:
		f.Verdict = NeverFits
		f.Reason = fmt.Sprintf("it needs %s at start (%s), more than the ledger's capacity of %s", b(n.Start), n.StartParts, b(capacity))
	case n.Full <= f.Free:
		f.Verdict = FitsNow
		f.Reason = fmt.Sprintf("%s free holds it at full context (%s)", b(f.Free), b(n.Full))
	case n.Start <= f.Free:
		f.Verdict, f.GiveBack = StartsNow, n.Full-f.Free
		f.Reason = fmt.Sprintf("%s free holds its start (%s); at full context (%s) it needs %s more from others", b(f.Free), b(n.Start), b(n.Full), b(f.GiveBack))
		if n.Full > capacity {
			f.Reason += fmt.Sprintf(", and its full context exceeds the capacity of %s: it runs with fewer or shorter sequences at once", b(capacity))
		}
	default:
		f.Verdict, f.GiveBack = FitsAfterGiveBack, n.Start-f.Free
		f.Reason = fmt.Sprintf("%s free, %s needed at start: others must give back %s", b(f.Free), b(n.Start), b(f.GiveBack))
	}
	return f
}

// FitError is an engine that never fits a shared ledger: its start
// exceeds the ledger's capacity (a capacity below the weights among
// them). It matches memapi.ErrOverBudget. Nothing was joined or charged.
type FitError struct {
	Ledger string // the ledger's path
	Model  string // the model's path
	Fit    Fit
}

func (e *FitError) Error() string {
	return fmt.Sprintf("%s never fits the ledger %s: %s", e.Model, e.Ledger, e.Fit.Reason)
}

// Is makes a FitError match memapi.ErrOverBudget.
func (e *FitError) Is(target error) bool { return target == memapi.ErrOverBudget }

// CheckFit reads the shared ledger at path without joining it (Inspect)
// and answers n (Header.Fit): an engine that never fits is a *FitError
// for model; any other answer is returned. A missing or unreadable ledger
// is Inspect's typed error. Nothing is joined or charged either way.
func CheckFit(path, model string, n Need) (Fit, error) {
	h, _, err := Inspect(path)
	if err != nil {
		return Fit{}, err
	}
	f := h.Fit(n)
	if f.Verdict == NeverFits {
		return f, &FitError{Ledger: path, Model: model, Fit: f}
	}
	return f, nil
}
