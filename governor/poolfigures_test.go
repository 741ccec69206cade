package governor

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/memapi"
)

// TestOverBudgetErrorPoolFigures: a pool's over-budget error is the
// governor's type with the pool's figures (Pool); its message gives both,
// or the pool's alone when the governor gave none (no holder), and it
// unwraps as the governor's does.
func TestOverBudgetErrorPoolFigures(t *testing.T) {
	figs := &PoolFigures{Request: 11, Segment: 22, Held: 33, InUse: 14, Cached: 19, Trimmed: 5}
	pool := "[pool: request 11, segment 22, held 33 (14 in use, 19 cached), 5 trimmed]"

	withGov := &OverBudgetError{Op: "pool.Alloc", Kind: memapi.ErrOverBudget, Authority: "dev0", Holder: "kv",
		Wanted: 22, Free: 7, Capacity: 40, Pool: figs, Err: context.DeadlineExceeded}
	msg := withGov.Error()
	for _, want := range []string{"pool.Alloc: over budget", "holder kv wanted 22: free 7", "capacity 40", "[authority dev0]", pool, "deadline exceeded"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%q lacks %q", msg, want)
		}
	}

	alone := &OverBudgetError{Op: "pool.Alloc", Kind: memapi.ErrOverBudget, Authority: "dev0", Wanted: 22,
		Reason: "the binding could not back the growth in time", Pool: figs, Err: context.DeadlineExceeded}
	msg = alone.Error()
	if !strings.Contains(msg, pool) || strings.Contains(msg, "holder") || strings.Contains(msg, "free 0") {
		t.Errorf("%q: want the pool's figures and no governor figures", msg)
	}
	for _, e := range []error{withGov, alone} {
		if !errors.Is(e, memapi.ErrOverBudget) || !errors.Is(e, context.DeadlineExceeded) {
			t.Errorf("%v does not unwrap to memapi.ErrOverBudget and its cause", e)
		}
	}

	plain := &OverBudgetError{Op: "governor.Reserve", Kind: memapi.ErrOverBudget, Authority: "dev0", Holder: "kv", Wanted: 22}
	if strings.Contains(plain.Error(), "[pool:") {
		t.Errorf("%q: pool figures without a pool", plain.Error())
	}
}
