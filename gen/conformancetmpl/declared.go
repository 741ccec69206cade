//go:build memgentmpl

// memgen:needs DeviceAllocator.Info MechanismInfo DeviceKey DeviceKind

package conformance

import (
	"os"
	"reflect"
	"strings"

	memapi "github.com/memgen/memgen/generated/memapi"
)

// The spec/... subtests compare what the mechanism says about itself with
// its declaration: the capabilities it offers, its device kind and its
// granularity kind. The declaration is, first found:
//
//   - Subject.Declared, which the factory sets: a plugin's descriptor
//     (plugin.Library.Declaration), or a Go mechanism in another module
//     declaring itself as the spec would;
//   - the mechanism's own, when it has a method Declaration()
//     memapi.MechanismMeta (a bare plugin instance);
//   - the spec's entry for the package the mechanism's type is defined in
//     (memapi.Meta, generated with the constant SpecName in that package):
//     a mechanism of a declared package that reports another name fails
//     spec/name instead of skipping the others;
//   - the spec's entry named Info().Mechanism.
//
// A wrapper that says what it wraps (the checked wrapper's Unwrap) is
// looked through: the mechanism beneath is found as if it were the subject.
// A mechanism with none of them fails spec/name, naming the spec's
// mechanisms; nothing is skipped silently. A fake declares itself
// (fakes.Mechanism.Declaration), and so can any test mechanism.

func init() {
	scenarios = append(scenarios,
		test{"spec/name", 0, testSpecName},
		test{"spec/offers", 0, testSpecOffers},
		test{"spec/device", 0, testSpecDevice},
		test{"spec/granularity", 0, testSpecGranularity},
	)
}

// module is the module path of the spec's mechanism packages.
const module = "github.com/memgen/memgen"

// declaration finds the subject's declaration (see above) and says where
// it comes from; ok is false when there is none.
func (e *env) declaration() (d memapi.MechanismMeta, from string, ok bool) {
	if e.declaredBy != nil {
		return *e.declaredBy, "Subject.Declared", true
	}
	for m, depth := e.m, 0; m != nil && depth < maxUnwrap; depth++ {
		if s, yes := m.(interface{ Declaration() memapi.MechanismMeta }); yes {
			return s.Declaration(), "the mechanism's Declaration()", true
		}
		if pkg := typePackage(m); pkg != "" {
			for _, d := range memapi.Meta.Mechanisms {
				if module+"/"+d.Package == pkg {
					return d, "the spec's entry for package " + d.Package, true
				}
			}
		}
		w, yes := m.(interface{ Unwrap() memapi.Mechanism })
		if !yes {
			break
		}
		m = w.Unwrap()
	}
	if m, yes := memapi.MechanismSpec(e.info.Mechanism); yes {
		return m, "the spec", true
	}
	return memapi.MechanismMeta{}, "", false
}

// maxUnwrap bounds the wrappers looked through: a wrapper that unwraps to
// itself must not hang the suite.
const maxUnwrap = 16

// specNames lists the mechanisms the spec declares, for an error message.
func specNames() string {
	var b strings.Builder
	for i, d := range memapi.Meta.Mechanisms {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(string(d.Name))
	}
	return b.String()
}

// typePackage is the import path of the package m's type is defined in.
func typePackage(m memapi.Mechanism) string {
	t := reflect.TypeOf(m)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// declared returns the subject's declaration, or skips the subtest when it
// has none.
func (e *env) declared(t T) memapi.MechanismMeta {
	t.Helper()
	d, _, ok := e.declaration()
	if !ok {
		t.Skipf("mechanism %q has no declaration, which spec/name reports as a failure: nothing to compare with", e.info.Mechanism)
	}
	return d
}

// testSpecName: Info().Mechanism is the declared name. For a mechanism of
// a package the spec declares, a mismatch fails here, where it used to make
// every other spec subtest skip; a mechanism with no declaration at all
// fails here too, naming the spec's mechanisms.
func testSpecName(t T, e *env) {
	d, from, ok := e.declaration()
	if !ok {
		t.Fatalf("mechanism %q (type %T) matches no mechanism the spec declares (%s), by name or by the package of its type, and the subject declares none: report the spec's name (the generated constant SpecName of a mechanism's package), or set Subject.Declared for a mechanism the spec does not declare", e.info.Mechanism, e.m, specNames())
	}
	if d.Name != e.info.Mechanism {
		t.Errorf("Info().Mechanism is %q, but %s declares the mechanism as %q (in a mechanism's package, report the generated constant SpecName)", e.info.Mechanism, from, d.Name)
	}
}

// testSpecOffers: the capabilities the accessors report are exactly those the
// spec's offers list declares, none hidden (but those the factory says the
// subject lacks on this machine) and none added.
func testSpecOffers(t T, e *env) {
	d := e.declared(t)
	if both := e.lacks & e.caps; both != 0 {
		t.Errorf("the subject is said to lack %s (Subject.Lacks), but its accessors report it offered", both)
	}
	if hidden := d.Offers &^ e.caps &^ e.lacks; hidden != 0 {
		t.Errorf("the spec declares that mechanism %s offers %s, but its accessors report %s absent", d.Name, d.Offers, hidden)
	}
	if lacked := d.Offers & e.lacks &^ e.caps; lacked != 0 {
		t.Logf("mechanism %s lacks %s on this machine (Subject.Lacks)", d.Name, lacked)
	}
	if extra := e.caps &^ d.Offers; extra != 0 {
		t.Errorf("mechanism %s offers %s, which the spec does not declare for it (offers: %s)", d.Name, extra, d.Offers)
	}
}

// testSpecDevice: Info().Device.Kind is the spec's device, and so is the
// device the subject's context runs on.
func testSpecDevice(t T, e *env) {
	d := e.declared(t)
	if got := e.info.Device.Kind.String(); got != d.Device {
		t.Errorf("the spec declares mechanism %s on device %s, but Info().Device.Kind is %s", d.Name, d.Device, got)
	}
	if got := e.dc.Device().Kind.String(); got != d.Device {
		t.Errorf("the spec declares mechanism %s on device %s, but its device context runs on %s", d.Name, d.Device, got)
	}
}

// testSpecGranularity: Info().Granularity is of the spec's granularity kind.
// page: the host's page size; configurable: a power of two and a multiple of
// the host's page size (the mechanism maps host pages, at the size it was
// configured with); device: a power of two (what the device reports). The
// allocation granularity is a power of two for every kind; a mechanism that
// offers DeviceAllocator alone may report no mapping granularity.
func testSpecGranularity(t T, e *env) {
	d := e.declared(t)
	g, page := e.info.Granularity, memapi.Bytes(os.Getpagesize())
	pow2 := func(n memapi.Bytes) bool { return n != 0 && n&(n-1) == 0 }
	if a := e.info.AllocGranularity; !pow2(a) {
		t.Errorf("Info().AllocGranularity is %d, not a power of two", a)
	}
	if g == 0 && e.caps == memapi.Of(memapi.CapDeviceAllocator) {
		return // an allocator alone has no mapping granularity to compare
	}
	switch d.Granularity {
	case "page":
		if g != page {
			t.Errorf("the spec declares mechanism %s's granularity as the page size (%d), but Info().Granularity is %d", d.Name, page, g)
		}
	case "configurable":
		if !pow2(g) || g%page != 0 {
			t.Errorf("the spec declares mechanism %s's granularity configurable (a power of two, a multiple of the %d-byte page), but Info().Granularity is %d", d.Name, page, g)
		}
	case "device":
		if !pow2(g) {
			t.Errorf("the spec declares mechanism %s's granularity as the device's (a power of two), but Info().Granularity is %d", d.Name, g)
		}
	default:
		t.Errorf("the spec declares mechanism %s's granularity %q, a kind the suite does not know", d.Name, d.Granularity)
	}
}
