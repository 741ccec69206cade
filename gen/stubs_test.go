package gen

import (
	"fmt"
	"path"
)

// mechanismStubs returns, for every mechanism of s, a stand-in for its
// hand-written half, so that the generated glue can be compiled without it:
// the type embeds the fake Mechanism (which implements every capability)
// and has the offers hook the glue calls.
func mechanismStubs(s *Spec, module string) map[string][]byte {
	out := map[string][]byte{}
	for _, m := range s.Mechanisms {
		src := fmt.Sprintf(`package %s

import (
	%q
	%q
)

// %s stands in for the hand-written mechanism in tests of the generator.
type %s struct{ *fakes.Mechanism }

func (*%s) offers(memapi.Capability) bool { return true }
`, path.Base(m.Package), module+"/"+s.Packages.Contract, module+"/"+s.Packages.Fakes, m.Type, m.Type, m.Type)
		out[m.Package+"/mechanism_stub.go"] = []byte(src)
	}
	return out
}
