package gen

import (
	"strings"
	"unicode"

	"go/token"

	. "github.com/dave/jennifer/jen"
)

// Type returns the Go type of a spec type name, qualified with the contract
// package (jennifer drops the qualifier inside the contract itself). Handles
// are pointers: a handle's identity is its address.
func (g *Gen) Type(name string) Code {
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
func (g *Gen) C(name string) *Statement { return Qual(g.Contract(), name) }

// Signature returns the parameter list and results of m.
func (g *Gen) Signature(m *Method) (params []Code, results []Code) {
	for _, p := range m.Params {
		params = append(params, Id(p.Name).Add(g.Type(p.Type)))
	}
	for _, r := range m.Returns {
		results = append(results, g.Type(r.Type))
	}
	return params, results
}

// IsHandle reports whether name is a declared handle type.
func (g *Gen) IsHandle(name string) bool {
	t := g.Spec.Type(name)
	return t != nil && t.Kind == KindHandle
}

// Zero returns the zero value of a spec type, for early error returns.
func (g *Gen) Zero(name string) Code {
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
	if g.Spec.Interface(name) != nil || g.IsHandle(name) {
		return Nil()
	}
	t := g.Spec.Type(name)
	switch {
	case t == nil:
		return Nil()
	case t.Kind == KindScalar && t.Go == "string":
		return Lit("")
	case t.Kind == KindScalar || t.Kind == KindEnum:
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

// lowerFirst returns n with its first letter lower-cased.
func lowerFirst(n string) string {
	if n == "" {
		return n
	}
	return strings.ToLower(n[:1]) + n[1:]
}

// Doc wraps a spec doc string as a Go comment starting with name.
func Doc(name, doc string) string {
	doc = strings.TrimSpace(doc)
	if doc == "" {
		return name + " is declared in the spec."
	}
	if strings.HasPrefix(doc, name+" ") || strings.HasPrefix(doc, name+"\n") {
		return doc
	}
	first, _, _ := strings.Cut(doc, " ")
	switch {
	case first == "A" || first == "An" || first == "The":
		return name + " is " + lowerFirst(doc)
	case strings.HasSuffix(first, "s") && !strings.HasSuffix(first, "ss"):
		return name + " " + lowerFirst(doc)
	}
	return name + ": " + doc
}

type commenter interface{ Comment(string) *Statement }

// comment writes text as // lines (jennifer would make a /* */ block of a
// multi-line comment, which Go doc comments avoid).
func comment(c commenter, text string) {
	for _, l := range strings.Split(text, "\n") {
		c.Comment(l)
	}
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
