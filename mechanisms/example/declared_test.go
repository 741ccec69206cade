package example

import (
	"slices"
	"testing"

	"github.com/memgen/memgen/generated/conformance"
	"github.com/memgen/memgen/generated/memapi"
	"github.com/memgen/memgen/internal/conformancetest"
)

// TestDeclaredSubject is a Go mechanism of another module (the in-memory
// one, which the spec does not declare): with Subject.Declared the spec
// subtests run against its declaration, pass when it is true, and fail when
// it names another name or other offers; without it spec/name fails.
func TestDeclaredSubject(t *testing.T) {
	spec := []string{"spec/name", "spec/offers", "spec/device", "spec/granularity"}
	record := func(d *memapi.MechanismMeta) *conformancetest.Results {
		return conformancetest.Record(func(t conformance.T) conformance.Subject {
			s := factory(Config{}, nil)(t)
			s.Declared = d
			return s
		})
	}
	honest := memapi.MechanismMeta{Name: "mem", Device: "Host", Offers: memapi.Of(memapi.Capabilities...), Granularity: "device"}
	res := record(&honest)
	for _, n := range spec {
		if o, ok := res.Outcome(n); !ok || o.Failed || o.Skipped {
			t.Errorf("%s with a true declaration: %+v, want passed", n, o)
		}
	}
	undeclared := record(nil)
	if !slices.Contains(undeclared.Failed(), "spec/name") {
		t.Errorf("spec/name passed for a mechanism without any declaration")
	}
	for _, n := range spec[1:] {
		if !slices.Contains(undeclared.Skipped(), n) {
			t.Errorf("%s without any declaration was not skipped", n)
		}
	}
	wrong := honest
	wrong.Name, wrong.Offers = "arena", memapi.Of(memapi.CapDeviceAllocator)
	failed := record(&wrong).Failed()
	for _, n := range []string{"spec/name", "spec/offers"} {
		if !slices.Contains(failed, n) {
			t.Errorf("%s passed with a declaration of another name and fewer offers", n)
		}
	}
}
