package memgentest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/memgen/memgen/memgentest"
)

// A downstream test needs two lines of setup: the harness and a binding.
// Here a stand-in for the test's *testing.T prints what the harness
// reports when the test ends; in a test, pass t.
func Example() {
	t := &printT{}
	ctx := context.Background()

	h := memgentest.New(t, memgentest.Options{}) // governor, fake mechanism, manager
	kv := h.Bind("kv", "cache")                  // a *pmm.Binding

	buf, _ := kv.Allocate(ctx, 10_000)
	fmt.Println("charged:", h.Snapshot().Charged)
	_ = buf.Close()
	_, _ = kv.Allocate(ctx, 4096) // never closed: a leak

	t.end() // what the end of the test runs
	fmt.Println("charged after cleanup:", h.Snapshot().Charged)
	// Output:
	// charged: 12288
	// test failed: memgentest: leaked kv/cache buffer 0x100000013000: still open at the end of the test (never closed); 4096 bytes, made at example_test.go:24 (github.com/memgen/memgen/memgentest_test.Example)
	// charged after cleanup: 0
}

// printT prints the failures a *testing.T would report.
type printT struct {
	testing.TB
	cleanups []func()
}

func (t *printT) Helper()                      {}
func (t *printT) Cleanup(f func())             { t.cleanups = append(t.cleanups, f) }
func (t *printT) Errorf(f string, args ...any) { fmt.Printf("test failed: "+f+"\n", args...) }
func (t *printT) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }

func (t *printT) end() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
