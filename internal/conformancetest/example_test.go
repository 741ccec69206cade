package conformancetest_test

import (
	"fmt"

	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/internal/conformancetest"
	"github.com/memgen/memgen/mechanisms/example"
)

// Record runs the conformance suite with a recording T, so a test can assert
// which subtests a mechanism fails. The worked example's mechanism, honest,
// fails none.
func ExampleRecord() {
	factory := func(t conformance.T) conformance.Subject {
		m := example.New(example.Options{})
		ctx := example.NewContext(m)
		t.Cleanup(func() { ctx.Close() })
		return conformance.Subject{Mechanism: m, Context: ctx}
	}
	res := conformancetest.Record(factory)
	fmt.Println("subtests:", len(res.Leaves()) == len(conformance.Names()))
	fmt.Println("failed:", res.Failed())
	// Output:
	// subtests: true
	// failed: []
}
