package conformancetest_test

import (
	"fmt"

	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/internal/conformancetest"
)

// Record runs the conformance suite with a recording T, so a test can assert
// which subtests a mechanism fails. The honest in-memory mechanism fails none.
func ExampleRecord() {
	factory := func(t conformance.T) conformance.Subject {
		m := conformancetest.New(conformancetest.Config{})
		ctx := conformancetest.NewContext(m)
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
