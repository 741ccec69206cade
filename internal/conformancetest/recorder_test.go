package conformancetest

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/memgen/memgen/generated/conformance"
)

// run records a tree of subtests run by body under a fresh root.
func run(body func(t conformance.T)) *Results {
	res := &Results{outcomes: map[string]*Outcome{}}
	(&recT{res: res}).run(body)
	return res
}

// TestRecorder checks the recording T behaves as testing.T does where the
// suite relies on it.
func TestRecorder(t *testing.T) {
	var order []string
	res := run(func(root conformance.T) {
		root.Run("a", func(t conformance.T) {
			t.Cleanup(func() { order = append(order, "first") })
			t.Cleanup(func() { order = append(order, "second") })
			t.Fatalf("stop %d", 1)
			order = append(order, "after Fatalf")
		})
		root.Run("b", func(t conformance.T) {
			t.Run("c", func(t conformance.T) { t.Skipf("not here") })
			t.Run("d", func(t conformance.T) { t.Logf("fine") })
		})
		root.Run("e", func(t conformance.T) {
			t.Cleanup(func() { t.Fatalf("cleanup fails") })
			var m map[string]int
			//lint:ignore SA5000 a runtime panic in the test function is what this subtest records
			m["x"] = 1
		})
	})
	if want := []string{"second", "first"}; !reflect.DeepEqual(order, want) {
		t.Errorf("cleanups ran as %v, want %v (last first, and Fatalf ends the test function)", order, want)
	}
	if got, want := res.Failed(), []string{"a", "e"}; !reflect.DeepEqual(got, want) {
		t.Errorf("failed leaves %v, want %v", got, want)
	}
	if got, want := res.Skipped(), []string{"b/c"}; !reflect.DeepEqual(got, want) {
		t.Errorf("skipped leaves %v, want %v", got, want)
	}
	if o, _ := res.Outcome("b"); o.Failed || o.Leaf {
		t.Errorf("group b: %+v, want a passing group", o)
	}
	e, _ := res.Outcome("e")
	if log := strings.Join(e.Log, "\n"); !strings.Contains(log, "panic: assignment to entry in nil map") || !strings.Contains(log, "cleanup fails") {
		t.Errorf("e's log misses the panic or the cleanup's failure:\n%s", log)
	}
	if !strings.Contains(res.Report(), "--- FAIL: a\n    stop 1") {
		t.Errorf("report:\n%s", res.Report())
	}
}

// TestRecordHooks: RecordWith tells its hooks of every subtest, a start
// before its subtests' and an end after them, with the outcome.
func TestRecordHooks(t *testing.T) {
	var events []string
	res := &Results{outcomes: map[string]*Outcome{}, hooks: Hooks{
		Start: func(n string) { events = append(events, "start "+n) },
		End: func(o Outcome) {
			events = append(events, fmt.Sprintf("end %s failed=%v leaf=%v", o.Name, o.Failed, o.Leaf))
		},
	}}
	(&recT{res: res}).run(func(root conformance.T) {
		root.Run("a", func(t conformance.T) {
			t.Run("b", func(t conformance.T) { t.Errorf("no") })
		})
	})
	want := []string{"start a", "start a/b", "end a/b failed=true leaf=true", "end a failed=true leaf=false"}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events %q, want %q", events, want)
	}
}
