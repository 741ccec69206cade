package gen

import (
	"fmt"
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

// fitParams returns the parameter list of a function declared by head (the
// declaration up to the name: `func (fake *Mechanism) Allocate`) with
// results: on one line, or one parameter per line when the signature would
// pass sigWidth columns.
func fitParams(head *Statement, params, results []Code) *Statement {
	probe := Null().Add(head).Params(params...).Params(results...)
	if len(params) > 1 && len(fmt.Sprintf("%#v", probe)) > sigWidth {
		return Custom(Options{Open: "(", Close: ")", Separator: ",", Multi: true}, params...)
	}
	return Params(params...)
}
