package memgentest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/memgen/memgen/governor"
	"github.com/memgen/memgen/internal/watchdog"
	"github.com/memgen/memgen/memgentest"
)

// TestAGrantLeftReservedFailsTheTest: a test that reserves on the
// harness's governor directly and never commits or cancels the grant
// holds no handle the teardown could close, so nothing else reports it;
// the harness's last check does: the authority is not back to zero, its
// reserved bytes named.
func TestAGrantLeftReservedFailsTheTest(t *testing.T) {
	rec := &recTB{TB: t}
	h := memgentest.New(rec, memgentest.Options{})
	h.Bind("kv", "cache") // registers the holder
	if _, err := h.Governor.Reserve(context.Background(), governor.Request{Authority: h.Authority, Holder: "kv", Role: "raw", Bytes: 4096}); err != nil {
		t.Fatal(err)
	}
	watchdog.Within(t, watchdog.Bound, "the cleanup", func() { rec.run() })
	f := rec.failures()
	if len(f) != 1 || !strings.Contains(f[0], "not back to zero") || !strings.Contains(f[0], "reserved 4096") {
		t.Fatalf("failures %q, want one naming the 4096 bytes still reserved", f)
	}
}
