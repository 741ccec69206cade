package gen

import (
	"strings"

	. "github.com/dave/jennifer/jen"
)

// litWidth is the longest string literal, and the longest one-line list of
// them, the emitters put on one line; longer ones are broken as a person
// would, so that no generated line runs far past a hundred columns.
const litWidth = 72

// longLit returns s as a string literal, or, when it is longer than
// litWidth, as a sum of literals, one per line, broken after spaces and
// newlines. The constant is the same string.
func longLit(s string) Code {
	if len(s) <= litWidth {
		return Lit(s)
	}
	var parts []string
	for len(s) > litWidth {
		cut := strings.LastIndexByte(s[:litWidth], ' ')
		if nl := strings.IndexByte(s[:litWidth], '\n'); nl >= 0 {
			cut = nl
		}
		if cut <= 0 {
			cut = litWidth - 1
		}
		parts = append(parts, s[:cut+1])
		s = s[cut+1:]
	}
	if s != "" {
		parts = append(parts, s)
	}
	st := Lit(parts[0])
	for _, p := range parts[1:] {
		st = st.Op("+").Line().Lit(p)
	}
	return st
}

// stringList returns a []string literal of items: on one line when it is
// short, otherwise one item per line.
func stringList(items []string) *Statement {
	n := 0
	var lits []Code
	for _, it := range items {
		n += len(it) + 4
		lits = append(lits, Lit(it))
	}
	if n <= litWidth {
		return Index().String().Values(lits...)
	}
	return Index().String().Custom(Options{Open: "{", Close: "}", Separator: ",", Multi: true}, lits...)
}

// sigWidth is the width past which a generated signature puts one
// parameter per line.
const sigWidth = 100

// fitParams returns a parameter list: on one line, or one parameter per
// line when the signature it belongs to is longer than sigWidth columns on
// one line (sigLen estimates that).
func fitParams(sigLen int, params []Code) *Statement {
	if len(params) > 1 && sigLen > sigWidth {
		return Custom(Options{Open: "(", Close: ")", Separator: ",", Multi: true}, params...)
	}
	return Params(params...)
}

// typeText is the Go text of a spec type as the emitters write it outside
// the contract package ("memapi.Bytes", "*memapi.Allocation").
func (g *generator) typeText(name string) string {
	switch name {
	case "context.Context", "[]byte", "<-chan struct{}", "error", "bool", "int", "string", "uint64":
		return name
	}
	if g.IsHandle(name) {
		return "*memapi." + name
	}
	return "memapi." + name
}

// sigLen is the length of `head(params) results` on one line, for a spec
// method's parameters (with extra ones before them) and results.
func (g *generator) sigLen(head string, extra []string, m *method) int {
	n := len(head) + 2
	parts := append([]string(nil), extra...)
	for _, p := range m.Params {
		parts = append(parts, p.Name+" "+g.typeText(p.Type))
	}
	n += len(strings.Join(parts, ", "))
	var rs []string
	for _, r := range m.Returns {
		rs = append(rs, g.typeText(r.Type))
	}
	switch len(rs) {
	case 0:
	case 1:
		n += 1 + len(rs[0])
	default:
		n += 3 + len(strings.Join(rs, ", "))
	}
	return n + 2 // " {"
}
