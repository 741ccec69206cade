package gen

import (
	"go/token"
	"strings"
	"unicode"

	. "github.com/dave/jennifer/jen"
)

// Type returns the Go type of a spec type name, qualified with the contract
// package (jennifer drops the qualifier inside the contract itself). Handles
// are pointers: a handle's identity is its address.
func (g *generator) Type(name string) Code {
	switch name {
	case "context.Context":
		return Qual("context", "Context")
	case "[]byte":
		return Index().Byte()
	case "<-chan struct{}":
		return Op("<-").Chan().Struct()
	case "error", "bool", "int", "string", "uint64":
		return Id(name)
	}
	if t := g.Spec.Type(name); t != nil && t.Kind == KindHandle {
		return Op("*").Qual(g.Contract(), name)
	}
	return Qual(g.Contract(), name)
}

// C returns a qualified identifier of the contract package.
func (g *generator) C(name string) *Statement { return Qual(g.Contract(), name) }

// Signature returns the parameter list and results of m.
func (g *generator) Signature(m *method) (params []Code, results []Code) {
	for _, p := range m.Params {
		params = append(params, Id(p.Name).Add(g.Type(p.Type)))
	}
	for _, r := range m.Returns {
		results = append(results, g.Type(r.Type))
	}
	return params, results
}

// IsHandle reports whether name is a declared handle type.
func (g *generator) IsHandle(name string) bool {
	t := g.Spec.Type(name)
	return t != nil && t.Kind == KindHandle
}

// Zero returns the zero value of a spec type, for early error returns.
func (g *generator) Zero(name string) Code {
	switch name {
	case "error", "context.Context", "[]byte", "<-chan struct{}":
		return Nil()
	case "bool":
		return False()
	case "int", "uint64":
		return Lit(0)
	case "string":
		return Lit("")
	}
	if g.Spec.interfaceNamed(name) != nil || g.IsHandle(name) {
		return Nil()
	}
	t := g.Spec.Type(name)
	switch {
	case t == nil:
		return Nil()
	case t.Kind == kindScalar && t.Go == "string":
		return Lit("")
	case t.Kind == kindScalar || t.Kind == kindEnum:
		return Lit(0)
	}
	return g.C(name).Values()
}

// words splits a Go name into lower-case words: ErrOutOfMemory -> out of memory.
func words(name string) string {
	var b strings.Builder
	rs := []rune(name)
	for i, r := range rs {
		if i > 0 && unicode.IsUpper(r) && (unicode.IsLower(rs[i-1]) || (i+1 < len(rs) && unicode.IsLower(rs[i+1]))) {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// lowerWord lower-cases the first letter of prose unless its first word is
// an acronym or a name ("NVIDIA GPU memory", "CUDA", "Go").
func lowerWord(s string) string {
	first, _, _ := strings.Cut(s, " ")
	if len(first) > 1 && unicode.IsUpper(rune(first[1])) || first == "Go" || first == "Linux" {
		return s
	}
	return lowerFirst(s)
}

// lowerFirst returns n with its first letter lower-cased.
func lowerFirst(n string) string {
	if n == "" {
		return n
	}
	return strings.ToLower(n[:1]) + n[1:]
}

// docComment makes a spec doc string the doc comment of name, a sentence that
// starts with the name as Go doc comments do: a doc that already starts with
// it is kept; "A ..."/"An ..."/"The ..." becomes "name is a ..."; a verb
// ("Completes when ...") follows the name; anything else ("Ordinary memory
// made by ...", "Where refunded bytes go ...") becomes "name is ...".
func docComment(name, doc string) string {
	doc = strings.TrimSpace(doc)
	if doc == "" {
		return name + " is declared in the spec."
	}
	if strings.HasPrefix(doc, name+" ") || strings.HasPrefix(doc, name+"\n") {
		return sentence(doc)
	}
	first, _, _ := strings.Cut(doc, " ")
	switch {
	case first == "A" || first == "An" || first == "The":
		return name + " is " + sentence(lowerWord(doc))
	case isVerb(first):
		return name + " " + sentence(lowerWord(doc))
	}
	return name + " is " + sentence(lowerWord(doc))
}

// isVerb guesses whether the first word of a doc is a verb in the third
// person ("Completes", "Reserves", "Asks"), not a plural noun ("Reads
// succeed") or a word ending in ss.
func isVerb(w string) bool {
	if !strings.HasSuffix(w, "s") || strings.HasSuffix(w, "ss") || w == "Reads" || w == "Writes" || w == "Bytes" {
		return false
	}
	return w[0] >= 'A' && w[0] <= 'Z'
}

// errorDoc is the doc comment of a sentinel error: the spec says in what
// case it is returned ("A size is zero or too large.").
func errorDoc(name, doc string) string {
	doc = strings.TrimSpace(doc)
	if doc == "" || strings.HasPrefix(doc, name+" ") {
		return docComment(name, doc)
	}
	return name + " is returned when " + sentence(lowerWord(doc))
}

// valueDoc is the doc comment of an enum value: what the value means
// ("Reads succeed; writes fault.", "Host memory, served by the CPU
// mechanism.").
func valueDoc(name, doc string) string {
	doc = strings.TrimSpace(doc)
	if doc == "" || strings.HasPrefix(doc, name+" ") {
		return docComment(name, doc)
	}
	// A doc that is a clause about accesses ("Reads succeed; ...") says what
	// the value means; a noun phrase says what it is.
	if first, _, _ := strings.Cut(doc, " "); first == "Reads" || first == "Writes" {
		return name + " means " + sentence(lowerWord(doc))
	}
	return name + " is " + sentence(lowerWord(doc))
}

// fieldName is the unexported struct field holding a handle's exported field.
func fieldName(n string) string {
	l := lowerFirst(n)
	if token.IsKeyword(l) {
		return l + "Field"
	}
	return l
}

// article returns "a" or "an" for a word.
func article(w string) string {
	if w != "" && strings.ContainsRune("AEIOUaeiou", rune(w[0])) {
		return "an"
	}
	return "a"
}
